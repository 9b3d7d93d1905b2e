// Collects log messages for the lifetime of the object, for tests that assert
// a warning was (or was not) logged. Not for concurrent use across tests.
#ifndef ZO_COMMON_TESTING_LOG_CAPTURE_H_
#define ZO_COMMON_TESTING_LOG_CAPTURE_H_

#include <string>
#include <string_view>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "common/logging.h"

namespace zo::testing {

class ScopedLogCapture {
 public:
  ScopedLogCapture() {
    SetLogSink([this](LogLevel level, std::string_view text) {
      absl::MutexLock lock(&mu_);
      lines_.push_back(std::string(LogLevelName(level)) + ": " + std::string(text));
    });
  }
  ~ScopedLogCapture() { SetLogSink(nullptr); }

  // Each captured message as "LEVEL: text".
  std::vector<std::string> lines() const {
    absl::MutexLock lock(&mu_);
    return lines_;
  }

 private:
  mutable absl::Mutex mu_;
  std::vector<std::string> lines_ ABSL_GUARDED_BY(mu_);
};

}  // namespace zo::testing

#endif  // ZO_COMMON_TESTING_LOG_CAPTURE_H_
