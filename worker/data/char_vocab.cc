#include "worker/data/char_vocab.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace zo {

CharVocab CharVocab::FromText(std::string_view text) {
  std::array<bool, 256> seen{};
  for (char c : text) seen[static_cast<unsigned char>(c)] = true;
  CharVocab vocab;
  for (int b = 0; b < 256; ++b) {
    if (!seen[b]) continue;
    vocab.ids_[b] = static_cast<int32_t>(vocab.chars_.size());
    vocab.chars_.push_back(static_cast<char>(b));
  }
  return vocab;
}

absl::StatusOr<std::vector<int32_t>> CharVocab::Encode(std::string_view text) const {
  std::vector<int32_t> ids(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    ids[i] = Id(text[i]);
    if (ids[i] < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("char vocab: byte 0x", absl::Hex(static_cast<unsigned char>(text[i])),
                       " at offset ", i, " is not in the vocabulary"));
    }
  }
  return ids;
}

absl::StatusOr<std::string> CharVocab::Decode(absl::Span<const int32_t> ids) const {
  std::string text(ids.size(), '\0');
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= size()) {
      return absl::InvalidArgumentError(absl::StrCat("char vocab: id ", ids[i], " at index ", i,
                                                     " is outside [0, ", size(), ")"));
    }
    text[i] = chars_[ids[i]];
  }
  return text;
}

}  // namespace zo
