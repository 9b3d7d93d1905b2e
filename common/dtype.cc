#include "common/dtype.h"

#include <string>

#include "absl/strings/ascii.h"

namespace zo {

std::optional<DType> ParseDType(std::string_view name) {
  const std::string n = absl::AsciiStrToLower(std::string(name));
  if (n == "fp32" || n == "float32" || n == "float") return DType::kFloat32;
  if (n == "fp16" || n == "float16" || n == "half") return DType::kFloat16;
  if (n == "bf16" || n == "bfloat16") return DType::kBFloat16;
  return std::nullopt;
}

}  // namespace zo
