// A character-level vocabulary: the sorted distinct bytes of a text.
//
// Sorting makes the ids a function of the character set alone, so two workers
// that read the same file agree on every id without exchanging a table, and
// the ids match the usual char-GPT preprocessing (Tiny Shakespeare: 65 ids,
// '\n' = 0, ' ' = 1).
//
// Immutable after construction; safe to share across threads.
#ifndef ZO_WORKER_DATA_CHAR_VOCAB_H_
#define ZO_WORKER_DATA_CHAR_VOCAB_H_

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace zo {

class CharVocab {
 public:
  // The vocabulary of the bytes that occur in `text` (empty text: size 0).
  static CharVocab FromText(std::string_view text);

  int size() const { return static_cast<int>(chars_.size()); }

  // The id of `c`, or -1 when `c` is not in the vocabulary.
  int32_t Id(char c) const { return ids_[static_cast<unsigned char>(c)]; }
  // The character of id `id`; requires 0 <= id < size().
  char Char(int32_t id) const { return chars_[id]; }
  // The distinct characters in id order.
  const std::string& chars() const { return chars_; }

  // INVALID_ARGUMENT names the first byte (and its offset) not in the vocabulary.
  absl::StatusOr<std::vector<int32_t>> Encode(std::string_view text) const;
  // INVALID_ARGUMENT names the first id (and its index) outside [0, size()).
  absl::StatusOr<std::string> Decode(absl::Span<const int32_t> ids) const;

 private:
  CharVocab() { ids_.fill(-1); }

  std::string chars_;
  std::array<int32_t, 256> ids_;
};

}  // namespace zo

#endif  // ZO_WORKER_DATA_CHAR_VOCAB_H_
