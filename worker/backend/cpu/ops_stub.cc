// TEMPORARY: ops not written yet (replaced by linear.cc, embedding.cc, ...).
#include "worker/backend/cpu/internal/cpu_backend_impl.h"

namespace zo::backend::cpu {
namespace {
[[noreturn]] void Todo(const char* op) {
  CheckShape(false, op, "not implemented yet");
  __builtin_unreachable();
}
}  // namespace

Tensor CpuBackend::Linear(const Tensor&, const Tensor&, const Tensor&) { Todo("Linear"); }
Tensor CpuBackend::LinearBackward(const Tensor&, const Tensor&, const Tensor&, bool, Tensor&,
                                  Tensor*) { Todo("LinearBackward"); }
Tensor CpuBackend::Embedding(absl::Span<const int32_t>, int, const Tensor&, const Tensor&) {
  Todo("Embedding");
}
void CpuBackend::EmbeddingBackward(absl::Span<const int32_t>, int, const Tensor&, Tensor&,
                                   Tensor&) { Todo("EmbeddingBackward"); }
Tensor CpuBackend::LayerNorm(const Tensor&, const Tensor&, const Tensor&, float, Tensor&,
                             Tensor&) { Todo("LayerNorm"); }
Tensor CpuBackend::LayerNormBackward(const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                     const Tensor&, Tensor&, Tensor&) { Todo("LayerNormBackward"); }
Tensor CpuBackend::Gelu(const Tensor&) { Todo("Gelu"); }
Tensor CpuBackend::GeluBackward(const Tensor&, const Tensor&) { Todo("GeluBackward"); }
Tensor CpuBackend::Relu(const Tensor&) { Todo("Relu"); }
Tensor CpuBackend::ReluBackward(const Tensor&, const Tensor&) { Todo("ReluBackward"); }
Tensor CpuBackend::Add(const Tensor&, const Tensor&) { Todo("Add"); }
void CpuBackend::AddInto(const Tensor&, Tensor&) { Todo("AddInto"); }
Tensor CpuBackend::Attention(const Tensor&, int, int, Tensor&) { Todo("Attention"); }
Tensor CpuBackend::AttentionBackward(const Tensor&, const Tensor&, const Tensor&, int, int) {
  Todo("AttentionBackward");
}
Tensor CpuBackend::CrossEntropy(const Tensor&, absl::Span<const int32_t>) { Todo("CrossEntropy"); }
Tensor CpuBackend::CrossEntropyBackward(const Tensor&, absl::Span<const int32_t>, float) {
  Todo("CrossEntropyBackward");
}

}  // namespace zo::backend::cpu
