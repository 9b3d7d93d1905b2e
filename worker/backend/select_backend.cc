#include "worker/backend/select_backend.h"

#include "absl/strings/str_cat.h"
#include "worker/backend/cpu/cpu_backend.h"
#ifdef ZO_HAVE_CUDA
#include "worker/backend/cuda/cuda_backend.h"
#endif

namespace zo::backend {

absl::StatusOr<std::unique_ptr<Backend>> SelectBackend(const BackendChoice& choice,
                                                       std::string* why) {
  const auto say = [&](std::string s) {
    if (why != nullptr) *why = std::move(s);
  };
  if (choice.device != "auto" && choice.device != "cuda" && choice.device != "cpu") {
    return absl::InvalidArgumentError(
        absl::StrCat("--device must be auto, cuda or cpu, not '", choice.device, "'"));
  }
  if (choice.device == "cpu") {
    say("the CPU backend (--device cpu)");
    return MakeCpuBackend({.blas_threads = choice.blas_threads});
  }
#ifdef ZO_HAVE_CUDA
  std::string no_gpu;
  const int gpus = CudaDeviceCount(&no_gpu);
  if (gpus > 0) {
    say(absl::StrCat("the CUDA backend on GPU ", choice.gpu, " of ", gpus,
                     choice.deterministic ? " (deterministic)" : ""));
    return MakeCudaBackend({.device = choice.gpu, .deterministic = choice.deterministic});
  }
  if (choice.device == "cuda") {
    return absl::FailedPreconditionError(
        absl::StrCat("--device cuda: no CUDA device (", no_gpu, ")"));
  }
  say(absl::StrCat("the CPU backend (no CUDA device: ", no_gpu, ")"));
#else
  if (choice.device == "cuda") {
    return absl::FailedPreconditionError(
        "--device cuda: this build has no CUDA backend (configure with nvcc on the PATH or "
        "-DZO_WITH_CUDA=ON)");
  }
  say("the CPU backend (this build has no CUDA backend)");
#endif
  return MakeCpuBackend({.blas_threads = choice.blas_threads});
}

}  // namespace zo::backend
