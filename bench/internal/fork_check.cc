#include "bench/internal/fork_check.h"

#include <algorithm>
#include <fstream>
#include <string>

#include "absl/strings/numbers.h"

// Weak: null when this binary does not link OpenBLAS.
extern "C" int openblas_get_num_threads(void) __attribute__((weak));

namespace zo::bench_internal {

int ThreadsBesidesBlasPool() {
  std::ifstream in("/proc/self/status");
  int threads = 0;
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("Threads:", 0) == 0 && absl::SimpleAtoi(line.substr(8), &threads)) break;
  }
  // The pool: one thread per OpenBLAS thread beyond the caller's.
  const int pool = openblas_get_num_threads != nullptr ? openblas_get_num_threads() - 1 : 0;
  return std::max(threads - std::max(pool, 0), 0);
}

}  // namespace zo::bench_internal
