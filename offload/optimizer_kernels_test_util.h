// Test helpers shared by the optimizer kernel tests: the kernel paths to run
// (each SimdLevel, plus AVX-512 with and without VCVTNEPS2BF16), buffers that
// start off alignment with guard elements around them, and gradients encoded
// as fp32 / fp16 / bf16 whose exact decoded values feed the double references.
#ifndef ZO_OFFLOAD_OPTIMIZER_KERNELS_TEST_UTIL_H_
#define ZO_OFFLOAD_OPTIMIZER_KERNELS_TEST_UTIL_H_

#include <cmath>
#include <cstdint>
#include <cstring>
#include <ostream>
#include <string>
#include <vector>

#include "common/bf16.h"
#include "common/cpu_features.h"
#include "common/dtype.h"
#include "common/fp16.h"
#include "gtest/gtest.h"
#include "offload/internal/optimizer_kernels_isa.h"
#include "offload/optimizer_kernels.h"

namespace zo::kernel_testing {

// fp32 unit roundoff: one correctly rounded operation errs by at most this
// much relative to its exact result.
inline constexpr double kUnitRoundoff = 0x1p-24;

// One way to run the kernels: the public API at a level, or (bf16_insn set)
// the AVX-512 kernels directly with VCVTNEPS2BF16 forced on or off.
struct KernelPath {
  std::string name;
  SimdLevel level;
  int bf16_insn = -1;  // -1: public dispatch; 0 / 1: AVX-512 internal, insn off / on
};

inline void PrintTo(const KernelPath& p, std::ostream* os) { *os << p.name; }

inline std::vector<KernelPath> AllKernelPaths() {
  std::vector<KernelPath> paths;
  for (SimdLevel level : kAllSimdLevels)
    paths.push_back({std::string(SimdLevelName(level)), level});
  paths.push_back({"avx512_intbf16", SimdLevel::kAvx512, 0});
  paths.push_back({"avx512_bf16insn", SimdLevel::kAvx512, 1});
  return paths;
}

// Empty when the host can run the path, else why not (for GTEST_SKIP).
inline std::string Unsupported(const KernelPath& p) {
  if (!SimdLevelSupported(p.level)) return std::string(SimdLevelName(p.level)) + " not supported";
  if (p.bf16_insn == 1 && !HostCpuFeatures().avx512_bf16) return "no AVX512-BF16 on this CPU";
  return "";
}

inline offload_internal::KernelIo InternalIo(TypedConstPtr grad, TypedPtr copy,
                                             bool copy_old = false) {
  using offload_internal::CopyType;
  using offload_internal::SrcType;
  const SrcType src = grad.dtype == DType::kFloat32   ? SrcType::kF32
                      : grad.dtype == DType::kFloat16 ? SrcType::kF16
                                                      : SrcType::kBf16;
  CopyType ct = CopyType::kNone;
  if (copy.data != nullptr) {
    ct = copy.dtype == DType::kFloat32   ? CopyType::kF32
         : copy.dtype == DType::kFloat16 ? CopyType::kF16
                                         : CopyType::kBf16;
  }
  return {grad.data, src, copy.data, ct, copy_old};
}

inline void RunAdam(const KernelPath& path, const AdamStepConstants& c, TypedConstPtr grad,
                    float* p, float* m, float* v, TypedPtr copy, size_t n,
                    CopyOf copy_of = CopyOf::kNewWeight) {
  if (path.bf16_insn < 0) return AdamUpdate(c, grad, p, m, v, copy, n, path.level, copy_of);
  const offload_internal::AdamArgs a = {
      c.grad_scale, c.beta1,          c.beta2, c.one_minus_beta1, c.one_minus_beta2,
      c.step_size,  c.inv_sqrt_bias2, c.eps,   c.weight_decay,    c.decay_factor};
  offload_internal::AdamAvx512(a, InternalIo(grad, copy, copy_of == CopyOf::kOldWeight),
                               {p, m, v, p, m, v, /*stream=*/false}, n, path.bf16_insn == 1);
}

// AdamUpdateBeside on `path`.
inline void RunAdamBeside(const KernelPath& path, const AdamStepConstants& c, TypedConstPtr grad,
                          const float* p, const float* m, const float* v, AdamOutputs out,
                          TypedPtr copy, size_t n) {
  if (path.bf16_insn < 0) return AdamUpdateBeside(c, grad, p, m, v, out, copy, n, path.level);
  const offload_internal::AdamArgs a = {
      c.grad_scale, c.beta1,          c.beta2, c.one_minus_beta1, c.one_minus_beta2,
      c.step_size,  c.inv_sqrt_bias2, c.eps,   c.weight_decay,    c.decay_factor};
  offload_internal::AdamAvx512(a, InternalIo(grad, copy, false),
                               {p, m, v, out.p, out.m, out.v, /*stream=*/true}, n,
                               path.bf16_insn == 1);
}

inline void RunAdagrad(const KernelPath& path, const AdagradStepConstants& c, TypedConstPtr grad,
                       float* p, float* sum, TypedPtr copy, size_t n) {
  if (path.bf16_insn < 0) return AdagradUpdate(c, grad, p, sum, copy, n, path.level);
  const offload_internal::AdagradArgs a = {c.grad_scale, c.lr, c.eps, c.weight_decay};
  offload_internal::AdagradAvx512(a, InternalIo(grad, copy), p, sum, n, path.bf16_insn == 1);
}

inline void RunLion(const KernelPath& path, const LionStepConstants& c, TypedConstPtr grad,
                    float* p, float* m, TypedPtr copy, size_t n) {
  if (path.bf16_insn < 0) return LionUpdate(c, grad, p, m, copy, n, path.level);
  const offload_internal::LionArgs a = {c.grad_scale, c.lr, c.beta1, c.beta2, c.decay_factor};
  offload_internal::LionAvx512(a, InternalIo(grad, copy), p, m, n, path.bf16_insn == 1);
}

// n elements of T starting `offset` elements past a 64-byte boundary (so the
// start is unaligned for offset != 0), with kGuard sentinel elements on both
// sides that a kernel must not touch.
template <typename T>
class GuardedBuffer {
 public:
  static constexpr size_t kGuard = 32;

  GuardedBuffer(size_t n, size_t offset) : n_(n), storage_(n + offset + 2 * kGuard + 64) {
    const uintptr_t base = reinterpret_cast<uintptr_t>(storage_.data());
    const size_t skip = ((64 - base % 64) % 64) / sizeof(T);  // T-aligned already
    begin_ = skip + kGuard + offset;
    std::memset(storage_.data(), kFill, storage_.size() * sizeof(T));
  }

  T* data() { return storage_.data() + begin_; }
  const T* data() const { return storage_.data() + begin_; }
  size_t size() const { return n_; }
  T& operator[](size_t i) { return data()[i]; }
  const T& operator[](size_t i) const { return data()[i]; }

  // True when every element outside [data(), data() + n) still holds the fill.
  bool GuardsIntact() const {
    const unsigned char* bytes = reinterpret_cast<const unsigned char*>(storage_.data());
    const size_t lo = begin_ * sizeof(T), hi = (begin_ + n_) * sizeof(T);
    for (size_t i = 0; i < storage_.size() * sizeof(T); ++i) {
      if ((i < lo || i >= hi) && bytes[i] != kFill) return false;
    }
    return true;
  }

 private:
  static constexpr unsigned char kFill = 0xA5;
  size_t n_;
  size_t begin_;
  std::vector<T> storage_;
};

// A gradient buffer of `dtype` holding the encoding of given float values.
class GradBuffer {
 public:
  GradBuffer(DType dtype, size_t n, size_t offset)
      : dtype_(dtype), f32_(n, offset), u16_(n, offset) {}

  // Stores `x` encoded (fp16/bf16 round to nearest even) and returns the
  // exact value stored, decoded.
  double Set(size_t i, float x) {
    switch (dtype_) {
      case DType::kFloat32:
        f32_[i] = x;
        return x;
      case DType::kFloat16:
        u16_[i] = FloatToHalfBits(x);
        return HalfBitsToFloat(u16_[i]);
      case DType::kBFloat16:
        u16_[i] = FloatToBf16Bits(x);
        return Bf16BitsToFloat(u16_[i]);
    }
    return 0.0;
  }
  void SetBits(size_t i, uint16_t bits) { u16_[i] = bits; }  // fp16 / bf16 only

  double Get(size_t i) const {
    switch (dtype_) {
      case DType::kFloat32:
        return f32_[i];
      case DType::kFloat16:
        return HalfBitsToFloat(u16_[i]);
      case DType::kBFloat16:
        return Bf16BitsToFloat(u16_[i]);
    }
    return 0.0;
  }

  TypedConstPtr ptr() const {
    if (dtype_ == DType::kFloat32) return {f32_.data(), dtype_};
    return {u16_.data(), dtype_};
  }
  DType dtype() const { return dtype_; }

 private:
  DType dtype_;
  GuardedBuffer<float> f32_;
  GuardedBuffer<uint16_t> u16_;
};

// The low-precision copy a kernel must write for master value x.
inline uint16_t LowBits(DType dtype, float x) {
  return dtype == DType::kFloat16 ? FloatToHalfBits(x) : FloatToBf16Bits(x);
}

inline bool SameBits(float a, float b) { return std::memcmp(&a, &b, sizeof(float)) == 0; }

}  // namespace zo::kernel_testing

#endif  // ZO_OFFLOAD_OPTIMIZER_KERNELS_TEST_UTIL_H_
