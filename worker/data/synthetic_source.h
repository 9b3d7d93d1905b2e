// Training text that needs no file, so the README demo and the convergence
// test run on a fresh machine.
//
// The text is sentences from a small fixed grammar ("The old king guards a
// river near the tower.") whose word choices follow a seeded Markov chain: a
// subject prefers some verbs, a verb prefers some objects. Inside a word each
// character nearly fixes the next, so a character model can learn far more
// than the character frequencies: the bigram conditional entropy is well
// below the unigram entropy (text_entropy.h; the test asks for >= 0.5 bits),
// which makes "the loss fell below the unigram entropy" a meaningful check.
#ifndef ZO_WORKER_DATA_SYNTHETIC_SOURCE_H_
#define ZO_WORKER_DATA_SYNTHETIC_SOURCE_H_

#include <cstddef>
#include <cstdint>
#include <string>

namespace zo {

// Exactly `bytes` bytes of printable ASCII and '\n'; the same (bytes, seed)
// always gives the same text, and a shorter request is a prefix of a longer
// one with the same seed. About 1 MB (1 << 20) is enough for a demo run.
std::string SyntheticText(size_t bytes, uint64_t seed);

}  // namespace zo

#endif  // ZO_WORKER_DATA_SYNTHETIC_SOURCE_H_
