// A character-level training set: one text, its vocabulary, and batches of
// random windows for next-character prediction.
//
// Each row of a batch is a window of block_size + 1 consecutive characters;
// the first block_size are the inputs and the last block_size the targets.
// Where a window starts is a pure function of (seed, step, dp_rank, row)
// (internal/counter_rng.h), so every data-parallel rank draws its own stream
// from one shared seed, a restarted rank resumes exactly where it left off,
// and the order in which steps or ranks are sampled changes nothing.
//
// Immutable after construction; Sample is const and safe to call from any
// number of threads.
#ifndef ZO_WORKER_DATA_CHAR_DATASET_H_
#define ZO_WORKER_DATA_CHAR_DATASET_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/data/char_vocab.h"

namespace zo {

// One batch, row-major: row r of tokens is tokens[r * block_size, (r+1) * block_size).
struct CharBatch {
  int batch = 0;
  int block_size = 0;
  std::vector<int32_t> tokens;   // [batch x block_size] vocabulary ids
  std::vector<int32_t> targets;  // [batch x block_size] the next character of each token
  std::vector<int64_t> starts;   // [batch] offset in the text where each window starts
};

class CharDataset {
 public:
  static constexpr uint64_t kDefaultSeed = 1337;

  // Reads the whole file. NOT_FOUND names the path when it cannot be opened;
  // INVALID_ARGUMENT (naming the path) when it is empty.
  static absl::StatusOr<CharDataset> FromFile(const std::string& path,
                                              uint64_t seed = kDefaultSeed);
  // INVALID_ARGUMENT when `text` is empty.
  static absl::StatusOr<CharDataset> FromText(std::string text, uint64_t seed = kDefaultSeed);

  // `batch` windows for training step `step` on rank `dp_rank` of `dp_world`.
  // INVALID_ARGUMENT when batch or block_size is not positive, when dp_rank is
  // outside [0, dp_world), or when the text is shorter than block_size + 1.
  absl::StatusOr<CharBatch> Sample(int batch, int block_size, uint64_t step, int dp_rank,
                                   int dp_world) const;

  // Entropy of the text's character distribution, in bits: the loss (in bits)
  // of a model that learned only character frequencies.
  double UnigramEntropyBits() const { return unigram_entropy_bits_; }

  const CharVocab& vocab() const { return vocab_; }
  const std::string& text() const { return text_; }
  uint64_t seed() const { return seed_; }

 private:
  CharDataset(std::string text, CharVocab vocab, std::vector<int32_t> ids, uint64_t seed);

  std::string text_;
  CharVocab vocab_;
  std::vector<int32_t> ids_;  // text_ encoded once, so Sample only copies
  uint64_t seed_;
  double unigram_entropy_bits_;
};

}  // namespace zo

#endif  // ZO_WORKER_DATA_CHAR_DATASET_H_
