// The CUDA backend: tensors in device memory in their storage dtype
// (fp16/bf16/fp32), GEMMs through cuBLASLt on tensor cores with fp32
// accumulation, and the project's own kernels for everything else
// (internal/kernels.h), all queued on one stream per backend.
//
// The numbers are the CPU backend's (worker/backend/cpu/): fp32 arithmetic,
// each output rounded once to its dtype. They differ from it only in the
// order of fp32 sums, so tests compare the two within a few ulps.
#ifndef ZO_WORKER_BACKEND_CUDA_CUDA_BACKEND_H_
#define ZO_WORKER_BACKEND_CUDA_CUDA_BACKEND_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "worker/backend/backend.h"

namespace zo::backend {

struct CudaBackendOptions {
  // Which GPU (cudaSetDevice index).
  int device = 0;
  // Two runs give the same bits: GEMMs keep to cuBLASLt algorithms without
  // split-K reductions (the project's kernels are deterministic anyway).
  bool deterministic = false;
};

// How many CUDA devices this process can use; 0 when there is no driver or
// no device (`why`, when given, says which).
int CudaDeviceCount(std::string* why = nullptr);

// Bytes of device `device` in use by every process (total - free), or -1
// when it cannot be asked: what a benchmark samples for peak memory.
int64_t CudaMemoryInUse(int device);

// FAILED_PRECONDITION when there is no such device.
absl::StatusOr<std::unique_ptr<Backend>> MakeCudaBackend(const CudaBackendOptions& options = {});

}  // namespace zo::backend

#endif  // ZO_WORKER_BACKEND_CUDA_CUDA_BACKEND_H_
