// Entropy of a text's characters, in bits per character.
//
// These are the floors a character model is measured against: a model that
// learned nothing but the character frequencies reaches the unigram entropy
// as its loss (in bits); one that learned the previous character reaches the
// bigram conditional entropy. zo-train's convergence test asks for a loss
// below the unigram figure, and SyntheticText is built so that the gap
// between the two is large enough to observe.
#ifndef ZO_WORKER_DATA_TEXT_ENTROPY_H_
#define ZO_WORKER_DATA_TEXT_ENTROPY_H_

#include <string_view>

namespace zo {

// H(X) over the byte distribution of `text`; 0 for an empty text.
double UnigramEntropyBits(std::string_view text);

// H(X_t | X_{t-1}) over the adjacent byte pairs of `text`; 0 below two bytes.
double BigramConditionalEntropyBits(std::string_view text);

}  // namespace zo

#endif  // ZO_WORKER_DATA_TEXT_ENTROPY_H_
