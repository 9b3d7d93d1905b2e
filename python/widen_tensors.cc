#include "python/widen_tensors.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/convert.h"
#include "python/parallel_elements.h"

namespace py = pybind11;

namespace zo::python {
namespace {

struct Pair {
  const uint16_t* src;
  float* dst;
  int64_t elems;
  bool bf16;
};

// What torch calls the tensor's dtype ("torch.bfloat16").
std::string DTypeOf(const py::handle& t) { return py::str(t.attr("dtype")).cast<std::string>(); }

void CheckTensor(const py::handle& t, const std::string& what) {
  if (!py::hasattr(t, "data_ptr")) throw py::type_error(what + " is not a torch tensor");
  if (!t.attr("is_cpu").cast<bool>() || !t.attr("is_contiguous")().cast<bool>()) {
    throw py::value_error(what + " is not a contiguous CPU tensor");
  }
}

}  // namespace

void Widen(const py::list& sources, const py::list& destinations) {
  if (sources.size() != destinations.size()) {
    throw py::value_error(absl::StrCat("widen: ", sources.size(), " sources for ",
                                       destinations.size(), " destinations"));
  }
  std::vector<Pair> pairs;
  pairs.reserve(sources.size());
  for (size_t i = 0; i < sources.size(); ++i) {
    const py::handle s = sources[i];
    const py::handle d = destinations[i];
    const std::string what = absl::StrCat("widen: pair ", i, ": ");
    CheckTensor(s, what + "the source");
    CheckTensor(d, what + "the destination");
    const std::string sd = DTypeOf(s);
    if (sd != "torch.bfloat16" && sd != "torch.float16") {
      throw py::value_error(what + "the source is " + sd + ", not torch.bfloat16 or torch.float16");
    }
    if (DTypeOf(d) != "torch.float32") {
      throw py::value_error(what + "the destination is " + DTypeOf(d) + ", not torch.float32");
    }
    const auto n = s.attr("numel")().cast<int64_t>();
    if (d.attr("numel")().cast<int64_t>() != n) {
      throw py::value_error(absl::StrCat(what, "the source has ", n, " elements, the destination ",
                                         d.attr("numel")().cast<int64_t>()));
    }
    pairs.push_back({reinterpret_cast<const uint16_t*>(s.attr("data_ptr")().cast<uintptr_t>()),
                     reinterpret_cast<float*>(d.attr("data_ptr")().cast<uintptr_t>()), n,
                     sd == "torch.bfloat16"});
  }
  std::vector<int64_t> elems;
  elems.reserve(pairs.size());
  for (const Pair& p : pairs) elems.push_back(p.elems);
  py::gil_scoped_release release;
  ForElementsInParallel(elems, [&](size_t pair, int64_t begin, int64_t end) {
    const Pair& p = pairs[pair];
    const auto n = static_cast<size_t>(end - begin);
    if (p.bf16) {
      Bf16ToFloat(p.src + begin, p.dst + begin, n);
    } else {
      HalfToFloat(p.src + begin, p.dst + begin, n);
    }
  });
}

}  // namespace zo::python
