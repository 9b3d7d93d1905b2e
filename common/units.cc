#include "common/units.h"

#include <cmath>
#include <cstdlib>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace zo {
namespace {

// Two decimals below 100, one above: "1.86 GiB", "11.18 GiB", "217.9 GiB".
std::string Scaled(double v, const char* unit) {
  // Two calls, not a chosen format: clang checks StrFormat's format at
  // compile time and refuses one that is not a constant.
  return v >= 100 ? absl::StrFormat("%.1f %s", v, unit) : absl::StrFormat("%.2f %s", v, unit);
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

absl::StatusOr<int64_t> ParseBytes(const std::string& flag, const std::string& text) {
  std::string t(absl::StripAsciiWhitespace(text));
  const auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat("--", flag, " = '", text, "': ", why,
                                                   "; write bytes, e.g. 64Gi, 512Mi or 4096"));
  };
  if (!t.empty() && (t.back() == 'B' || t.back() == 'b')) t.pop_back();
  double multiplier = 1;
  if (!t.empty() && (t.back() == 'i' || t.back() == 'I')) {
    static constexpr char kUnits[] = "kmgt";
    const char* unit =
        t.size() >= 2
            ? std::strchr(kUnits, absl::ascii_tolower(static_cast<unsigned char>(t[t.size() - 2])))
            : nullptr;
    if (unit == nullptr || *unit == '\0') return bad("not a byte size");
    multiplier = std::ldexp(1.0, 10 * static_cast<int>(unit - kUnits + 1));
    t.resize(t.size() - 2);
  } else if (!t.empty() && absl::ascii_isalpha(static_cast<unsigned char>(t.back()))) {
    return bad(std::strchr("kKmMgGtT", t.back()) != nullptr
                   ? "ambiguous unit (powers of 1000 or 1024?)"
                   : "not a byte size");
  }
  char* end = nullptr;
  const double v = t.empty() ? 0 : std::strtod(t.c_str(), &end);
  if (t.empty() || end != t.c_str() + t.size() || !std::isfinite(v)) {
    return bad("not a byte size");
  }
  const double n = std::round(v * multiplier);
  if (n < 0 || n >= 4.6e18) return bad("out of range");
  return static_cast<int64_t>(n);
}

}  // namespace zo
