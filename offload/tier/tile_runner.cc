#include "offload/tier/tile_runner.h"

#include <algorithm>

#include "offload/step_partition.h"

namespace zo {

void RunTiles(ThreadPool* pool, int64_t count, const std::function<void(int, int64_t)>& fn,
              const std::function<void()>& pump, int max_workers) {
  if (count <= 0) return;
  const int workers = max_workers > 0 ? std::min(max_workers, pool->size()) : pool->size();
  const auto n = static_cast<size_t>(count);
  pool->RunOnAll([&](int w) {
    if (w >= workers) return;
    const auto end = static_cast<int64_t>(EvenShareBegin(n, workers, w + 1));
    for (auto t = static_cast<int64_t>(EvenShareBegin(n, workers, w)); t < end; ++t) {
      if (w == 0 && pump) pump();
      fn(w, t);
    }
    if (w == 0 && pump) pump();
  });
}

}  // namespace zo
