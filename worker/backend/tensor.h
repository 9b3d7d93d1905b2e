// A tensor in one backend's memory (worker/backend/backend.h).
//
// A Tensor is a handle: a storage dtype (what the GPU path would keep in
// device memory), a shape, and storage that only the backend which made it
// interprets. Copies share storage, as torch.Tensor does; ops write into the
// tensors they are given or return new ones, never into their inputs.
#ifndef ZO_WORKER_BACKEND_TENSOR_H_
#define ZO_WORKER_BACKEND_TENSOR_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/dtype.h"

namespace zo::backend {

using Shape = std::vector<int64_t>;

// Product of the dimensions (1 for a scalar shape {}).
int64_t NumElements(const Shape& shape);
// "[4, 64, 128]".
std::string ShapeString(const Shape& shape);

class Tensor {
 public:
  Tensor() = default;
  Tensor(DType dtype, Shape shape, std::shared_ptr<void> storage)
      : dtype_(dtype), shape_(std::move(shape)), storage_(std::move(storage)) {}

  bool defined() const { return storage_ != nullptr; }
  DType dtype() const { return dtype_; }
  const Shape& shape() const { return shape_; }
  int rank() const { return static_cast<int>(shape_.size()); }
  int64_t dim(int i) const { return shape_[i]; }
  int64_t numel() const { return NumElements(shape_); }
  // Size of the tensor in its storage dtype, as it crosses the wire.
  int64_t nbytes() const { return numel() * static_cast<int64_t>(DTypeSize(dtype_)); }

  // For the backend that made this tensor only.
  void* storage() const { return storage_.get(); }

 private:
  DType dtype_ = DType::kFloat32;
  Shape shape_;
  std::shared_ptr<void> storage_;
};

}  // namespace zo::backend

#endif  // ZO_WORKER_BACKEND_TENSOR_H_
