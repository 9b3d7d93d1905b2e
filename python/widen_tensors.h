// zo._native.widen: a 16-bit job's weights into an fp32 model's parameters
// (zo.torch's pull into staging buffers, then this), every element exactly,
// on all of the host's cores with the GIL released. torch's copy_ widens on
// torch's intra-op threads, which a script that leaves the cores to the
// offload server has set to one: 15 ms for 32 Mi elements on 2 cores, the
// largest part of the bf16-over-fp32 step's time outside the server.
#ifndef ZO_PYTHON_WIDEN_TENSORS_H_
#define ZO_PYTHON_WIDEN_TENSORS_H_

#include <pybind11/pybind11.h>

namespace zo::python {

// sources[i] (contiguous CPU torch.bfloat16 or torch.float16 tensors) into
// destinations[i] (contiguous CPU torch.float32 tensors of as many
// elements). ValueError naming the first pair that does not fit; nothing
// is written then.
void Widen(const pybind11::list& sources, const pybind11::list& destinations);

}  // namespace zo::python

#endif  // ZO_PYTHON_WIDEN_TENSORS_H_
