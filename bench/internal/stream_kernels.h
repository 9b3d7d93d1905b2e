// The STREAM-style baseline of `zo-bench adam`: the fused Adam step's exact
// memory traffic (read grad, p, m, v; write p, m, v and a 16-bit copy) with
// trivial arithmetic, written as a plain loop for the compiler to vectorize.
// One copy per ISA, each compiled with the same -O level and -m flags as the
// optimizer kernel path it is compared with (stream_kernels_<isa>.cc).
//
// As for the other per-ISA files: these include only C headers and this one.
#ifndef ZO_BENCH_INTERNAL_STREAM_KERNELS_H_
#define ZO_BENCH_INTERNAL_STREAM_KERNELS_H_

#include <stddef.h>
#include <stdint.h>

namespace zo::bench_internal {

// Coefficients of the trivial update; |b|, |c| < 1 keeps values bounded
// however many rounds run.
struct StreamCoefficients {
  float a, b, c;
};

// For i in [0, n): g = grad[i] (16-bit grads widened as bf16 bit patterns);
//   p[i] += a*g;  m[i] = b*m[i] + g;  v[i] = c*v[i] + g*g;
//   copy[i] = high half of p[i]'s bits.
// Arrays must not overlap.
using StreamFn = void (*)(const StreamCoefficients& k, const void* grad, float* p, float* m,
                          float* v, uint16_t* copy, size_t n);

void StreamF32GradScalar(const StreamCoefficients& k, const void* grad, float* p, float* m,
                         float* v, uint16_t* copy, size_t n);
void StreamU16GradScalar(const StreamCoefficients& k, const void* grad, float* p, float* m,
                         float* v, uint16_t* copy, size_t n);
void StreamF32GradAvx2(const StreamCoefficients& k, const void* grad, float* p, float* m, float* v,
                       uint16_t* copy, size_t n);
void StreamU16GradAvx2(const StreamCoefficients& k, const void* grad, float* p, float* m, float* v,
                       uint16_t* copy, size_t n);
void StreamF32GradAvx512(const StreamCoefficients& k, const void* grad, float* p, float* m,
                         float* v, uint16_t* copy, size_t n);
void StreamU16GradAvx512(const StreamCoefficients& k, const void* grad, float* p, float* m,
                         float* v, uint16_t* copy, size_t n);

}  // namespace zo::bench_internal

#endif  // ZO_BENCH_INTERNAL_STREAM_KERNELS_H_
