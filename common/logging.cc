#include "common/logging.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace zo {
namespace {

LogLevel LevelFromEnv() {
  const char* env = std::getenv("ZO_LOG_LEVEL");
  if (env == nullptr) return LogLevel::kInfo;
  std::string v = absl::AsciiStrToLower(env);
  if (v == "debug") return LogLevel::kDebug;
  if (v == "warning" || v == "warn") return LogLevel::kWarning;
  if (v == "error") return LogLevel::kError;
  return LogLevel::kInfo;
}

std::atomic<int>& MinLevelStorage() {
  static std::atomic<int> level{static_cast<int>(LevelFromEnv())};
  return level;
}

absl::Mutex sink_mu(absl::kConstInit);
LogSink* sink ABSL_GUARDED_BY(sink_mu) = nullptr;

// Basename keeps lines short; the full path adds nothing a grep can't find.
const char* Basename(const char* path) {
  const char* base = path;
  for (const char* p = path; *p != '\0'; ++p) {
    if (*p == '/') base = p + 1;
  }
  return base;
}

}  // namespace

std::string_view LogLevelName(LogLevel level) {
  switch (level) {
    case LogLevel::kDebug:
      return "DEBUG";
    case LogLevel::kInfo:
      return "INFO";
    case LogLevel::kWarning:
      return "WARNING";
    case LogLevel::kError:
      return "ERROR";
  }
  return "?";
}

LogLevel MinLogLevel() {
  return static_cast<LogLevel>(MinLevelStorage().load(std::memory_order_relaxed));
}

void SetMinLogLevel(LogLevel level) {
  MinLevelStorage().store(static_cast<int>(level), std::memory_order_relaxed);
}

void SetLogSink(LogSink new_sink) {
  absl::MutexLock lock(&sink_mu);
  delete sink;
  sink = new_sink ? new LogSink(std::move(new_sink)) : nullptr;
}

namespace logging_internal {

LogMessage::LogMessage(LogLevel level, const char* file, int line)
    : level_(level), file_(file), line_(line) {}

LogMessage::~LogMessage() {
  const std::string text = stream_.str();
  {
    absl::MutexLock lock(&sink_mu);
    if (sink != nullptr) {
      (*sink)(level_, text);
      return;
    }
  }
  // One write per line so concurrent messages never interleave mid-line.
  const std::string line =
      absl::StrCat(absl::FormatTime("%Y-%m-%d %H:%M:%E3S", absl::Now(), absl::LocalTimeZone()), " ",
                   std::string(LogLevelName(level_).substr(0, 1)), " ", Basename(file_), ":", line_,
                   "] ", text, "\n");
  std::fwrite(line.data(), 1, line.size(), stderr);
}

}  // namespace logging_internal
}  // namespace zo
