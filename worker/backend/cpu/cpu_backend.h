// The CPU backend: fp32 arithmetic, OpenBLAS for every GEMM, results rounded
// to the storage dtype (fp16/bf16) where the GPU path would store them.
//
// A tensor's storage here is an fp32 array whose values are all exactly
// representable in the tensor's dtype, so the numbers equal those of a
// device that stores fp16/bf16 and computes in fp32, without converting on
// every read. Upload/Download convert at the boundary.
#ifndef ZO_WORKER_BACKEND_CPU_CPU_BACKEND_H_
#define ZO_WORKER_BACKEND_CPU_CPU_BACKEND_H_

#include <memory>

#include "worker/backend/backend.h"

namespace zo::backend {

struct CpuBackendOptions {
  // OpenBLAS threads (process-wide setting); 0 leaves OpenBLAS's default.
  int blas_threads = 0;
};

std::unique_ptr<Backend> MakeCpuBackend(const CpuBackendOptions& options = {});

}  // namespace zo::backend

#endif  // ZO_WORKER_BACKEND_CPU_CPU_BACKEND_H_
