#include "python/parallel_elements.h"

#include <algorithm>
#include <thread>
#include <vector>

#include "common/cpu_features.h"

namespace zo::python {
namespace {

// Elements per piece: large enough that a piece costs far more than taking
// it, small enough that the threads finish together.
constexpr int64_t kPieceElems = int64_t{1} << 16;

struct Piece {
  size_t item;
  int64_t begin;
  int64_t end;
};

}  // namespace

void ForElementsInParallel(absl::Span<const int64_t> elems,
                           absl::FunctionRef<void(size_t item, int64_t begin, int64_t end)> fn) {
  std::vector<Piece> pieces;
  for (size_t i = 0; i < elems.size(); ++i) {
    for (int64_t b = 0; b < elems[i]; b += kPieceElems) {
      pieces.push_back({i, b, std::min(elems[i], b + kPieceElems)});
    }
  }
  const auto threads = std::min<size_t>(pieces.size(), static_cast<size_t>(HostThreads()));
  auto take_every = [&](size_t first) {
    for (size_t i = first; i < pieces.size(); i += threads) {
      fn(pieces[i].item, pieces[i].begin, pieces[i].end);
    }
  };
  std::vector<std::thread> helpers;
  for (size_t t = 1; t < threads; ++t) helpers.emplace_back(take_every, t);
  if (threads > 0) take_every(0);
  for (std::thread& t : helpers) t.join();
}

}  // namespace zo::python
