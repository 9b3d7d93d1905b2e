// The element types that cross the wire and sit in tensors.
#ifndef ZO_COMMON_DTYPE_H_
#define ZO_COMMON_DTYPE_H_

#include <cstddef>
#include <optional>
#include <ostream>
#include <string_view>

namespace zo {

enum class DType { kFloat32, kFloat16, kBFloat16 };

constexpr size_t DTypeSize(DType t) { return t == DType::kFloat32 ? 4 : 2; }

// "fp32", "fp16", "bf16".
constexpr std::string_view DTypeName(DType t) {
  switch (t) {
    case DType::kFloat32:
      return "fp32";
    case DType::kFloat16:
      return "fp16";
    case DType::kBFloat16:
      return "bf16";
  }
  return "?";
}

// The name, for logs and test listings.
inline std::ostream& operator<<(std::ostream& os, DType t) { return os << DTypeName(t); }

// Accepts the short names and the spellings users write in configs and
// PyTorch ("float16", "half", "bfloat16", "float32", "float").
std::optional<DType> ParseDType(std::string_view name);

}  // namespace zo

#endif  // ZO_COMMON_DTYPE_H_
