// Per-ISA optimizer kernels behind offload/optimizer_kernels.h. Each set is
// defined in a file compiled with that ISA's -m flags
// (optimizer_kernels_avx2.cc, optimizer_kernels_avx512.cc); call one only when
// SimdLevelSupported() says the host can run it.
//
// Rule for those files (as common/internal/convert_kernels.h explains): include
// nothing but <immintrin.h>, C headers and this header, and keep every helper
// in an anonymous namespace. That is why this header mirrors the public
// constants and dtypes in plain structs instead of including
// optimizer_kernels.h (whose headers bring inline functions along).
//
// Contracts as in offload/optimizer_kernels.h: any n (0 included), no
// alignment needed, arrays must not overlap; thread-safe on disjoint ranges.
// Results match the scalar reference within a few ulps (FMA contraction); the
// low-precision copy is bit-exact round-to-nearest-even of the stored master.
#ifndef ZO_OFFLOAD_INTERNAL_OPTIMIZER_KERNELS_ISA_H_
#define ZO_OFFLOAD_INTERNAL_OPTIMIZER_KERNELS_ISA_H_

#include <stddef.h>
#include <stdint.h>

namespace zo::offload_internal {

// Element type of a gradient / source buffer.
enum class SrcType : int { kF32, kF16, kBf16 };
// What the kernel writes as the copy of the master weight.
enum class CopyType : int { kNone, kF32, kF16, kBf16 };

// Mirrors of the public *StepConstants (same meaning, see optimizer_kernels.h).
struct AdamArgs {
  float grad_scale, beta1, beta2, one_minus_beta1, one_minus_beta2;
  float step_size, inv_sqrt_bias2, eps, weight_decay, decay_factor;
};
struct AdagradArgs {
  float grad_scale, lr, eps, weight_decay;
};
struct LionArgs {
  float grad_scale, lr, beta1, beta2, decay_factor;
};

// The buffers of one call. `grad` has `grad_type`; `copy` is ignored when
// copy_type is kNone. copy_old (Adam only): the copy rounds the master as it
// was before the update instead of the new one.
struct KernelIo {
  const void* grad;
  SrcType grad_type;
  void* copy;
  CopyType copy_type;
  bool copy_old;
};

// The state arrays of one Adam call: read from p, m and v, written to
// p_out, m_out and v_out, which are either the same pointers (in place) or
// arrays that overlap neither them nor each other (beside the state). With
// `stream`, full vectors go to the outputs with non-temporal stores where
// they are aligned to a vector (the kernel checks), then an sfence.
struct AdamArrays {
  const float* p;
  const float* m;
  const float* v;
  float* p_out;
  float* m_out;
  float* v_out;
  bool stream;
};

// Sum of squares (double) and whether any value was NaN or +-Inf.
struct KernelStats {
  double sum_squares;
  bool non_finite;
};

// AVX2 + FMA + F16C. bf16 rounding in integer arithmetic.
void AdamAvx2(const AdamArgs& a, const KernelIo& io, const AdamArrays& s, size_t n);
void AdagradAvx2(const AdagradArgs& a, const KernelIo& io, float* p, float* sum, size_t n);
void LionAvx2(const LionArgs& a, const KernelIo& io, float* p, float* m, size_t n);
// `stats` may be null (no statistics).
void AccumulateAvx2(const void* src, SrcType type, float* acc, size_t n, bool overwrite,
                    KernelStats* stats);
KernelStats StatsAvx2(const void* src, SrcType type, size_t n);

// AVX-512 F/BW/VL/DQ + FMA + F16C, masked tails. `use_bf16_insn` selects
// VCVTNEPS2BF16 for a bf16 copy (host must have AVX512-BF16), with the lanes it
// gets wrong (fp32 subnormals, NaN) redone in integer arithmetic.
void AdamAvx512(const AdamArgs& a, const KernelIo& io, const AdamArrays& s, size_t n,
                bool use_bf16_insn);
void AdagradAvx512(const AdagradArgs& a, const KernelIo& io, float* p, float* sum, size_t n,
                   bool use_bf16_insn);
void LionAvx512(const LionArgs& a, const KernelIo& io, float* p, float* m, size_t n,
                bool use_bf16_insn);
void AccumulateAvx512(const void* src, SrcType type, float* acc, size_t n, bool overwrite,
                      KernelStats* stats);
KernelStats StatsAvx512(const void* src, SrcType type, size_t n);

}  // namespace zo::offload_internal

#endif  // ZO_OFFLOAD_INTERNAL_OPTIMIZER_KERNELS_ISA_H_
