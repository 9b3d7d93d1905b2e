// A small leveled logger: one timestamped line per message on stderr.
//
//   ZO_LOG(INFO) << "opened job " << name;
//
// Our Abseil predates absl/log, hence this. The minimum level comes from
// ZO_LOG_LEVEL (debug|info|warning|error, default info) and can be set in code.
// Thread-safe: each message is formatted privately and written with one call.
#ifndef ZO_COMMON_LOGGING_H_
#define ZO_COMMON_LOGGING_H_

#include <functional>
#include <sstream>
#include <string>
#include <string_view>

namespace zo {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3 };

std::string_view LogLevelName(LogLevel level);

// Messages below this level are dropped (not even formatted).
LogLevel MinLogLevel();
void SetMinLogLevel(LogLevel level);

// Receives every emitted message (level and text without the prefix).
// Replaces stderr output while installed; tests use ScopedLogCapture instead.
using LogSink = std::function<void(LogLevel, std::string_view)>;
void SetLogSink(LogSink sink);  // an empty sink restores stderr

namespace logging_internal {

// Accumulates one message and emits it on destruction.
class LogMessage {
 public:
  LogMessage(LogLevel level, const char* file, int line);
  ~LogMessage();
  LogMessage(const LogMessage&) = delete;
  LogMessage& operator=(const LogMessage&) = delete;
  std::ostream& stream() { return stream_; }

 private:
  const LogLevel level_;
  const char* const file_;
  const int line_;
  std::ostringstream stream_;
};

// Lets the macro discard the stream expression with a void result.
struct Voidify {
  void operator&(std::ostream&) {}
};

}  // namespace logging_internal
}  // namespace zo

#define ZO_LOG_LEVEL_DEBUG ::zo::LogLevel::kDebug
#define ZO_LOG_LEVEL_INFO ::zo::LogLevel::kInfo
#define ZO_LOG_LEVEL_WARNING ::zo::LogLevel::kWarning
#define ZO_LOG_LEVEL_ERROR ::zo::LogLevel::kError

#define ZO_LOG(severity)                                                                    \
  (ZO_LOG_LEVEL_##severity < ::zo::MinLogLevel())                                           \
      ? (void)0                                                                             \
      : ::zo::logging_internal::Voidify() &                                                 \
            ::zo::logging_internal::LogMessage(ZO_LOG_LEVEL_##severity, __FILE__, __LINE__) \
                .stream()

#endif  // ZO_COMMON_LOGGING_H_
