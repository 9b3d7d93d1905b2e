#include "worker/model/layer.h"

namespace zo::model {

int64_t Layer::param_count() const {
  int64_t n = 0;
  for (const Param& p : params_) n += p.numel();
  return n;
}

void Layer::Bind(backend::Backend& backend, DType dtype, bool grads, bool values) {
  for (Param& p : params_) {
    p.value = values ? backend.Zeros(dtype, p.shape) : backend::Tensor();
    p.grad = grads ? backend.Zeros(DType::kFloat32, p.shape) : backend::Tensor();
  }
}

Param& Layer::AddParam(const std::string& suffix, backend::Shape shape, ParamInit init) {
  Param& p = params_.emplace_back();
  p.name = name_ + "." + suffix;
  p.shape = std::move(shape);
  p.init = init;
  return p;
}

}  // namespace zo::model
