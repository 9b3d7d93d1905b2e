// Picks the backend a worker computes with, from what the user asked
// (zo-train --device auto|cuda|cpu) and what this build and machine have.
#ifndef ZO_WORKER_BACKEND_SELECT_BACKEND_H_
#define ZO_WORKER_BACKEND_SELECT_BACKEND_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "worker/backend/backend.h"

namespace zo::backend {

struct BackendChoice {
  std::string device = "auto";  // auto: CUDA when built in and a GPU is present, else CPU
  int gpu = 0;                  // CUDA device index
  bool deterministic = false;   // CUDA: same bits run after run
  int blas_threads = 0;         // CPU: OpenBLAS threads (0: its default)
};

// INVALID_ARGUMENT for an unknown device name; FAILED_PRECONDITION when
// "cuda" is asked of a build or machine without it. `why`, when given, says
// in one line what was chosen and why (for the log).
absl::StatusOr<std::unique_ptr<Backend>> SelectBackend(const BackendChoice& choice,
                                                       std::string* why = nullptr);

}  // namespace zo::backend

#endif  // ZO_WORKER_BACKEND_SELECT_BACKEND_H_
