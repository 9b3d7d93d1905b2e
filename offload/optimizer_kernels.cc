// Step constants, SIMD dispatch and the scalar reference kernels. The scalar
// loops are written to read like the formulas in optimizer_kernels.h: they are
// what the AVX2 / AVX-512 paths (offload/internal/) are tested against.
#include "offload/optimizer_kernels.h"

#include <cassert>
#include <cmath>
#include <cstring>

#include "common/bf16.h"
#include "common/fp16.h"
#include "offload/internal/optimizer_kernels_isa.h"

namespace zo {
namespace {

namespace oi = offload_internal;

// Loads and stores of the typed buffers go through memcpy: the API does not
// promise more alignment than a byte.
template <typename T>
T LoadUnaligned(const void* base, size_t i) {
  T v;
  std::memcpy(&v, static_cast<const char*>(base) + i * sizeof(T), sizeof(T));
  return v;
}

template <typename T>
void StoreUnaligned(void* base, size_t i, T v) {
  std::memcpy(static_cast<char*>(base) + i * sizeof(T), &v, sizeof(T));
}

float LoadValue(TypedConstPtr src, size_t i) {
  switch (src.dtype) {
    case DType::kFloat32:
      return LoadUnaligned<float>(src.data, i);
    case DType::kFloat16:
      return HalfBitsToFloat(LoadUnaligned<uint16_t>(src.data, i));
    case DType::kBFloat16:
      return Bf16BitsToFloat(LoadUnaligned<uint16_t>(src.data, i));
  }
  return 0.0f;
}

void StoreCopy(TypedPtr dst, size_t i, float value) {
  if (dst.data == nullptr) return;
  switch (dst.dtype) {
    case DType::kFloat32:
      return StoreUnaligned<float>(dst.data, i, value);
    case DType::kFloat16:
      return StoreUnaligned<uint16_t>(dst.data, i, FloatToHalfBits(value));
    case DType::kBFloat16:
      return StoreUnaligned<uint16_t>(dst.data, i, FloatToBf16Bits(value));
  }
}

// torch.sign: +-1, 0 for +-0, NaN for NaN.
float Sign(float x) {
  if (x > 0.0f) return 1.0f;
  if (x < 0.0f) return -1.0f;
  if (x == 0.0f) return 0.0f;
  return x;
}

// Reads every input of an element before writing its outputs, so the same
// loop serves in place (outputs = inputs) and beside the state.
void AdamScalar(const AdamStepConstants& c, TypedConstPtr grad, const oi::AdamArrays& s,
                TypedPtr low_precision, size_t n, CopyOf copy_of) {
  for (size_t i = 0; i < n; ++i) {
    const float p0 = s.p[i], m0 = s.m[i], v0 = s.v[i];
    if (copy_of == CopyOf::kOldWeight) StoreCopy(low_precision, i, p0);
    float g = LoadValue(grad, i) * c.grad_scale;
    if (c.weight_decay != 0.0f) g += c.weight_decay * p0;
    const float param = p0 * c.decay_factor;
    const float m1 = c.beta1 * m0 + c.one_minus_beta1 * g;
    const float v1 = c.beta2 * v0 + c.one_minus_beta2 * g * g;
    const float denom = std::sqrt(v1) * c.inv_sqrt_bias2 + c.eps;
    const float p1 = param - c.step_size * (m1 / denom);
    s.m_out[i] = m1;
    s.v_out[i] = v1;
    s.p_out[i] = p1;
    if (copy_of == CopyOf::kNewWeight) StoreCopy(low_precision, i, p1);
  }
}

void AdagradScalar(const AdagradStepConstants& c, TypedConstPtr grad, float* p, float* sum,
                   TypedPtr low_precision, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    float g = LoadValue(grad, i) * c.grad_scale;
    if (c.weight_decay != 0.0f) g += c.weight_decay * p[i];
    sum[i] += g * g;
    p[i] -= c.lr * (g / (std::sqrt(sum[i]) + c.eps));
    StoreCopy(low_precision, i, p[i]);
  }
}

void LionScalar(const LionStepConstants& c, TypedConstPtr grad, float* p, float* m,
                TypedPtr low_precision, size_t n) {
  const float one_minus_beta1 = 1.0f - c.beta1;
  const float one_minus_beta2 = 1.0f - c.beta2;
  for (size_t i = 0; i < n; ++i) {
    const float g = LoadValue(grad, i) * c.grad_scale;
    const float update = Sign(c.beta1 * m[i] + one_minus_beta1 * g);
    p[i] = p[i] * c.decay_factor - c.lr * update;
    m[i] = c.beta2 * m[i] + one_minus_beta2 * g;
    StoreCopy(low_precision, i, p[i]);
  }
}

void AddStats(float x, GradStats* stats) {
  if (!std::isfinite(x)) stats->non_finite = true;
  stats->sum_squares += static_cast<double>(x) * static_cast<double>(x);
}

void AccumulateScalar(TypedConstPtr src, float* acc, size_t n, bool overwrite, GradStats* stats) {
  for (size_t i = 0; i < n; ++i) {
    const float x = LoadValue(src, i);
    acc[i] = overwrite ? x : acc[i] + x;
    if (stats != nullptr) AddStats(acc[i], stats);
  }
}

GradStats StatsScalar(TypedConstPtr src, size_t n) {
  GradStats stats;
  for (size_t i = 0; i < n; ++i) AddStats(LoadValue(src, i), &stats);
  return stats;
}

// ---- conversions to the ISA files' plain types ----

[[maybe_unused]] oi::SrcType ToSrcType(DType t) {
  switch (t) {
    case DType::kFloat32:
      return oi::SrcType::kF32;
    case DType::kFloat16:
      return oi::SrcType::kF16;
    case DType::kBFloat16:
      return oi::SrcType::kBf16;
  }
  return oi::SrcType::kF32;
}

[[maybe_unused]] oi::KernelIo ToIo(TypedConstPtr grad, TypedPtr copy,
                                   CopyOf copy_of = CopyOf::kNewWeight) {
  oi::CopyType copy_type = oi::CopyType::kNone;
  if (copy.data != nullptr) {
    switch (copy.dtype) {
      case DType::kFloat32:
        copy_type = oi::CopyType::kF32;
        break;
      case DType::kFloat16:
        copy_type = oi::CopyType::kF16;
        break;
      case DType::kBFloat16:
        copy_type = oi::CopyType::kBf16;
        break;
    }
  }
  return {grad.data, ToSrcType(grad.dtype), copy.data, copy_type, copy_of == CopyOf::kOldWeight};
}

[[maybe_unused]] oi::AdamArgs ToArgs(const AdamStepConstants& c) {
  return {c.grad_scale, c.beta1,          c.beta2, c.one_minus_beta1, c.one_minus_beta2,
          c.step_size,  c.inv_sqrt_bias2, c.eps,   c.weight_decay,    c.decay_factor};
}

[[maybe_unused]] oi::AdagradArgs ToArgs(const AdagradStepConstants& c) {
  return {c.grad_scale, c.lr, c.eps, c.weight_decay};
}

[[maybe_unused]] oi::LionArgs ToArgs(const LionStepConstants& c) {
  return {c.grad_scale, c.lr, c.beta1, c.beta2, c.decay_factor};
}

[[maybe_unused]] void FromKernelStats(const oi::KernelStats& s, GradStats* out) {
  out->sum_squares = s.sum_squares;
  out->non_finite = s.non_finite;
}

[[maybe_unused]] bool UseBf16Insn() { return HostCpuFeatures().avx512_bf16; }

}  // namespace

AdamStepConstants MakeAdamStepConstants(const AdamHyperParams& hp, int64_t step,
                                        double grad_scale) {
  const double t = static_cast<double>(step);
  const double bias1 = hp.bias_correction ? 1.0 - std::pow(hp.beta1, t) : 1.0;
  const double bias2 = hp.bias_correction ? 1.0 - std::pow(hp.beta2, t) : 1.0;
  AdamStepConstants c;
  c.grad_scale = static_cast<float>(grad_scale);
  c.beta1 = static_cast<float>(hp.beta1);
  c.beta2 = static_cast<float>(hp.beta2);
  c.one_minus_beta1 = static_cast<float>(1.0 - hp.beta1);
  c.one_minus_beta2 = static_cast<float>(1.0 - hp.beta2);
  c.step_size = static_cast<float>(hp.lr / bias1);
  c.inv_sqrt_bias2 = static_cast<float>(1.0 / std::sqrt(bias2));
  c.eps = static_cast<float>(hp.eps);
  c.weight_decay = hp.adam_w_mode ? 0.0f : static_cast<float>(hp.weight_decay);
  c.decay_factor = hp.adam_w_mode ? static_cast<float>(1.0 - hp.lr * hp.weight_decay) : 1.0f;
  return c;
}

AdagradStepConstants MakeAdagradStepConstants(const AdagradHyperParams& hp, double grad_scale) {
  return {static_cast<float>(grad_scale), static_cast<float>(hp.lr), static_cast<float>(hp.eps),
          static_cast<float>(hp.weight_decay)};
}

LionStepConstants MakeLionStepConstants(const LionHyperParams& hp, double grad_scale) {
  return {static_cast<float>(grad_scale), static_cast<float>(hp.lr), static_cast<float>(hp.beta1),
          static_cast<float>(hp.beta2), static_cast<float>(1.0 - hp.lr * hp.weight_decay)};
}

// SIMD kernels exist only on x86-64; elsewhere only kScalar is ever supported.
namespace {

void AdamDispatch(const AdamStepConstants& c, TypedConstPtr grad, const oi::AdamArrays& s,
                  TypedPtr low_precision, size_t n, SimdLevel level, CopyOf copy_of) {
  assert(SimdLevelSupported(level));
  switch (level) {
#if defined(__x86_64__)
    case SimdLevel::kAvx2:
      return oi::AdamAvx2(ToArgs(c), ToIo(grad, low_precision, copy_of), s, n);
    case SimdLevel::kAvx512:
      return oi::AdamAvx512(ToArgs(c), ToIo(grad, low_precision, copy_of), s, n, UseBf16Insn());
#endif
    default:
      return AdamScalar(c, grad, s, low_precision, n, copy_of);
  }
}

}  // namespace

void AdamUpdate(const AdamStepConstants& c, TypedConstPtr grad, float* p, float* m, float* v,
                TypedPtr low_precision, size_t n, SimdLevel level, CopyOf copy_of) {
  AdamDispatch(c, grad, {p, m, v, p, m, v, /*stream=*/false}, low_precision, n, level, copy_of);
}

void AdamUpdate(const AdamStepConstants& c, TypedConstPtr grad, float* p, float* m, float* v,
                TypedPtr low_precision, size_t n, CopyOf copy_of) {
  AdamUpdate(c, grad, p, m, v, low_precision, n, ActiveSimdLevel(), copy_of);
}

void AdamUpdateBeside(const AdamStepConstants& c, TypedConstPtr grad, const float* p,
                      const float* m, const float* v, AdamOutputs out, TypedPtr low_precision,
                      size_t n, SimdLevel level) {
  AdamDispatch(c, grad, {p, m, v, out.p, out.m, out.v, /*stream=*/true}, low_precision, n, level,
               CopyOf::kNewWeight);
}

void AdamUpdateBeside(const AdamStepConstants& c, TypedConstPtr grad, const float* p,
                      const float* m, const float* v, AdamOutputs out, TypedPtr low_precision,
                      size_t n) {
  AdamUpdateBeside(c, grad, p, m, v, out, low_precision, n, ActiveSimdLevel());
}

void AdagradUpdate(const AdagradStepConstants& c, TypedConstPtr grad, float* p, float* sum,
                   TypedPtr low_precision, size_t n, SimdLevel level) {
  assert(SimdLevelSupported(level));
  switch (level) {
#if defined(__x86_64__)
    case SimdLevel::kAvx2:
      return oi::AdagradAvx2(ToArgs(c), ToIo(grad, low_precision), p, sum, n);
    case SimdLevel::kAvx512:
      return oi::AdagradAvx512(ToArgs(c), ToIo(grad, low_precision), p, sum, n, UseBf16Insn());
#endif
    default:
      return AdagradScalar(c, grad, p, sum, low_precision, n);
  }
}

void AdagradUpdate(const AdagradStepConstants& c, TypedConstPtr grad, float* p, float* sum,
                   TypedPtr low_precision, size_t n) {
  AdagradUpdate(c, grad, p, sum, low_precision, n, ActiveSimdLevel());
}

void LionUpdate(const LionStepConstants& c, TypedConstPtr grad, float* p, float* m,
                TypedPtr low_precision, size_t n, SimdLevel level) {
  assert(SimdLevelSupported(level));
  switch (level) {
#if defined(__x86_64__)
    case SimdLevel::kAvx2:
      return oi::LionAvx2(ToArgs(c), ToIo(grad, low_precision), p, m, n);
    case SimdLevel::kAvx512:
      return oi::LionAvx512(ToArgs(c), ToIo(grad, low_precision), p, m, n, UseBf16Insn());
#endif
    default:
      return LionScalar(c, grad, p, m, low_precision, n);
  }
}

void LionUpdate(const LionStepConstants& c, TypedConstPtr grad, float* p, float* m,
                TypedPtr low_precision, size_t n) {
  LionUpdate(c, grad, p, m, low_precision, n, ActiveSimdLevel());
}

void AccumulateGradient(TypedConstPtr src, float* acc, size_t n, bool overwrite, GradStats* stats,
                        SimdLevel level) {
  assert(SimdLevelSupported(level));
  if (stats != nullptr) *stats = GradStats();
  switch (level) {
#if defined(__x86_64__)
    case SimdLevel::kAvx2:
    case SimdLevel::kAvx512: {
      oi::KernelStats s{0.0, false};
      if (level == SimdLevel::kAvx2) {
        oi::AccumulateAvx2(src.data, ToSrcType(src.dtype), acc, n, overwrite,
                           stats != nullptr ? &s : nullptr);
      } else {
        oi::AccumulateAvx512(src.data, ToSrcType(src.dtype), acc, n, overwrite,
                             stats != nullptr ? &s : nullptr);
      }
      if (stats != nullptr) FromKernelStats(s, stats);
      return;
    }
#endif
    default:
      return AccumulateScalar(src, acc, n, overwrite, stats);
  }
}

void AccumulateGradient(TypedConstPtr src, float* acc, size_t n, bool overwrite, GradStats* stats) {
  AccumulateGradient(src, acc, n, overwrite, stats, ActiveSimdLevel());
}

GradStats ComputeGradStats(TypedConstPtr src, size_t n, SimdLevel level) {
  assert(SimdLevelSupported(level));
  GradStats stats;
  switch (level) {
#if defined(__x86_64__)
    case SimdLevel::kAvx2:
      FromKernelStats(oi::StatsAvx2(src.data, ToSrcType(src.dtype), n), &stats);
      return stats;
    case SimdLevel::kAvx512:
      FromKernelStats(oi::StatsAvx512(src.data, ToSrcType(src.dtype), n), &stats);
      return stats;
#endif
    default:
      return StatsScalar(src, n);
  }
}

GradStats ComputeGradStats(TypedConstPtr src, size_t n) {
  return ComputeGradStats(src, n, ActiveSimdLevel());
}

}  // namespace zo
