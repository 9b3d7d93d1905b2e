// A counter-based random number: a pure function of its keys, not a stream.
//
// Sampling in CharDataset, generation in SyntheticText and model
// initialisation must not depend on call order or on how many draws came
// before (a dp rank that restarts at step 1000 must see what it would have
// seen had it run from step 0; a tensor's initial values must not depend on
// how the model is cut into stages), so every draw hashes its own
// coordinates instead of advancing shared state.
#ifndef ZO_COMMON_COUNTER_RNG_H_
#define ZO_COMMON_COUNTER_RNG_H_

#include <cstdint>

namespace zo {

// SplitMix64's finalizer: a bijection on 64 bits with full avalanche.
inline uint64_t Mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// Hashes the keys in order; distinct key tuples give independent values.
inline uint64_t CounterRandom(uint64_t seed, uint64_t a, uint64_t b = 0, uint64_t c = 0) {
  uint64_t h = Mix64(seed);
  h = Mix64(h ^ a);
  h = Mix64(h ^ b);
  return Mix64(h ^ c);
}

// Maps a uniform 64-bit value onto [0, n) without a division (Lemire); the
// bias is below n / 2^64, far under anything a training run could notice.
inline uint64_t UniformBelow(uint64_t random, uint64_t n) {
  return static_cast<uint64_t>((static_cast<unsigned __int128>(random) * n) >> 64);
}

}  // namespace zo

#endif  // ZO_COMMON_COUNTER_RNG_H_
