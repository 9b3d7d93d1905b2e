#include "worker/data/char_dataset.h"

#include <algorithm>
#include <fstream>
#include <iterator>
#include <sstream>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/counter_rng.h"
#include "worker/data/text_entropy.h"

namespace zo {

CharDataset::CharDataset(std::string text, CharVocab vocab, std::vector<int32_t> ids, uint64_t seed)
    : text_(std::move(text)),
      vocab_(std::move(vocab)),
      ids_(std::move(ids)),
      seed_(seed),
      unigram_entropy_bits_(zo::UnigramEntropyBits(text_)) {}

absl::StatusOr<CharDataset> CharDataset::FromFile(const std::string& path, uint64_t seed) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("char dataset: cannot open '", path, "'"));
  std::ostringstream contents;
  contents << in.rdbuf();
  if (in.bad()) {
    return absl::DataLossError(absl::StrCat("char dataset: read of '", path, "' failed"));
  }
  std::string text = std::move(contents).str();
  if (text.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("char dataset: '", path, "' is empty"));
  }
  return FromText(std::move(text), seed);
}

absl::StatusOr<CharDataset> CharDataset::FromText(std::string text, uint64_t seed) {
  if (text.empty()) return absl::InvalidArgumentError("char dataset: text is empty");
  CharVocab vocab = CharVocab::FromText(text);
  absl::StatusOr<std::vector<int32_t>> ids = vocab.Encode(text);
  if (!ids.ok()) return ids.status();  // cannot happen: the vocab came from this text
  return CharDataset(std::move(text), std::move(vocab), std::move(ids).value(), seed);
}

absl::StatusOr<CharBatch> CharDataset::Sample(int batch, int block_size, uint64_t step, int dp_rank,
                                              int dp_world) const {
  if (batch <= 0 || block_size <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "char dataset: batch (", batch, ") and block_size (", block_size, ") must be positive"));
  }
  if (dp_world <= 0 || dp_rank < 0 || dp_rank >= dp_world) {
    return absl::InvalidArgumentError(absl::StrCat("char dataset: dp_rank ", dp_rank,
                                                   " is outside [0, dp_world=", dp_world, ")"));
  }
  const uint64_t n = ids_.size();
  if (n < static_cast<uint64_t>(block_size) + 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("char dataset: text of ", n,
                     " characters is shorter than block_size + 1 = ", block_size + 1));
  }
  // A window needs block_size + 1 characters, so it may start anywhere in
  // [0, n - block_size - 1]: n - block_size choices.
  const uint64_t choices = n - static_cast<uint64_t>(block_size);
  CharBatch out;
  out.batch = batch;
  out.block_size = block_size;
  const size_t cells = static_cast<size_t>(batch) * static_cast<size_t>(block_size);
  out.tokens.resize(cells);
  out.targets.resize(cells);
  out.starts.resize(batch);
  for (int row = 0; row < batch; ++row) {
    const uint64_t r =
        CounterRandom(seed_, step, static_cast<uint64_t>(dp_rank), static_cast<uint64_t>(row));
    const uint64_t start = UniformBelow(r, choices);
    out.starts[row] = static_cast<int64_t>(start);
    const auto window = ids_.begin() + static_cast<std::ptrdiff_t>(start);
    const size_t offset = static_cast<size_t>(row) * static_cast<size_t>(block_size);
    std::copy_n(window, block_size, out.tokens.begin() + static_cast<std::ptrdiff_t>(offset));
    std::copy_n(window + 1, block_size, out.targets.begin() + static_cast<std::ptrdiff_t>(offset));
  }
  return out;
}

}  // namespace zo
