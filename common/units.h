// Human-readable sizes and counts for command lines and reports.
#ifndef ZO_COMMON_UNITS_H_
#define ZO_COMMON_UNITS_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace zo {

// "1.50 GiB", "512 B": binary units, three significant digits.
std::string FormatBytes(double bytes);

// "13.00 B", "350.0 M", "7": decimal units as model sizes are quoted.
std::string FormatCount(double count);

// Parses a count as people write model sizes: "13B", "1.3b", "350M", "7e9",
// "125k", "1000", or with binary suffixes as buffer sizes are: "4Mi", "256Mi". The result must be a
// positive integer below 2^62.
absl::StatusOr<int64_t> ParseCount(const std::string& text);

// Parses a byte size given to flag --`flag`: "64Gi", "512Mi", "1.5GiB",
// "4096" (binary suffixes Ki, Mi, Gi, Ti, each optionally followed by B).
// "64G" or "64GB" are refused rather than guessed at. INVALID_ARGUMENT names
// the flag and shows how to write a size; the result is in [0, 2^62).
absl::StatusOr<int64_t> ParseBytes(const std::string& flag, const std::string& text);

}  // namespace zo

#endif  // ZO_COMMON_UNITS_H_
