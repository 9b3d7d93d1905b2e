#include "worker/backend/tensor.h"

#include "absl/strings/str_join.h"

namespace zo::backend {

int64_t NumElements(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string ShapeString(const Shape& shape) { return "[" + absl::StrJoin(shape, ", ") + "]"; }

}  // namespace zo::backend
