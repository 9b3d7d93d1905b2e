#include "common/units.h"

#include <cmath>
#include <cstdlib>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace zo {
namespace {

// Two decimals below 100, one above: "1.86 GiB", "11.18 GiB", "217.9 GiB".
std::string Scaled(double v, const char* unit) {
  return absl::StrFormat(v >= 100 ? "%.1f %s" : "%.2f %s", v, unit);
}

}  // namespace

std::string FormatBytes(double bytes) {
  static constexpr const char* kUnits[] = {"KiB", "MiB", "GiB", "TiB", "PiB"};
  if (bytes < 1024) return absl::StrFormat("%.0f B", bytes);
  int u = -1;
  while (bytes >= 1024 && u < 4) {
    bytes /= 1024;
    ++u;
  }
  return Scaled(bytes, kUnits[u]);
}

std::string FormatCount(double count) {
  static constexpr const char* kUnits[] = {"k", "M", "B", "T"};
  if (count < 1000) return absl::StrFormat("%.0f", count);
  int u = -1;
  while (count >= 1000 && u < 3) {
    count /= 1000;
    ++u;
  }
  return Scaled(count, kUnits[u]);
}

absl::StatusOr<int64_t> ParseCount(const std::string& text) {
  std::string t(absl::StripAsciiWhitespace(text));
  double multiplier = 1;
  // Binary suffixes as buffer sizes are written: 4Ki, 256Mi, 1Gi.
  static constexpr struct {
    const char* suffix;
    double value;
  } kBinary[] = {{"Ki", 1024.0}, {"Mi", 1048576.0}, {"Gi", 1073741824.0}, {"Ti", 1099511627776.0}};
  for (const auto& b : kBinary) {
    if (t.size() > 2 && t.compare(t.size() - 2, 2, b.suffix) == 0) {
      multiplier = b.value;
      t.resize(t.size() - 2);
      break;
    }
  }
  if (!t.empty() && multiplier == 1) {
    switch (absl::ascii_tolower(static_cast<unsigned char>(t.back()))) {
      case 'k':
        multiplier = 1e3;
        break;
      case 'm':
        multiplier = 1e6;
        break;
      case 'b':
        multiplier = 1e9;
        break;
      case 't':
        multiplier = 1e12;
        break;
      default:
        break;
    }
    if (multiplier != 1) t.pop_back();
  }
  char* end = nullptr;
  const double v = t.empty() ? 0 : std::strtod(t.c_str(), &end);
  if (t.empty() || end != t.c_str() + t.size() || !std::isfinite(v)) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", text, "' is not a count (write e.g. 13B, 350M, 7e9 or 1000)"));
  }
  const double n = std::round(v * multiplier);
  if (n < 1 || n >= 4.6e18) {
    return absl::InvalidArgumentError(
        absl::StrCat("count '", text, "' must be between 1 and 4.6e18"));
  }
  return static_cast<int64_t>(n);
}

}  // namespace zo
