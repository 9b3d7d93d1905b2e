#include "common/host_memory.h"

#include <fstream>
#include <iterator>
#include <limits>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace zo {

std::optional<int64_t> ParseMemAvailable(const std::string& text) {
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (!absl::ConsumePrefix(&line, "MemAvailable:")) continue;
    line = absl::StripAsciiWhitespace(line);
    if (!absl::ConsumeSuffix(&line, "kB")) return std::nullopt;
    int64_t kib = 0;
    if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(line), &kib) || kib < 0 ||
        kib > std::numeric_limits<int64_t>::max() / 1024) {
      return std::nullopt;
    }
    return kib * 1024;
  }
  return std::nullopt;
}

std::optional<int64_t> AvailableHostMemory() {
  std::ifstream in("/proc/meminfo");
  if (!in) return std::nullopt;
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return ParseMemAvailable(text);
}

}  // namespace zo
