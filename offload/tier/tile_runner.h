// Runs per-tile work of the tiered state on the pool's workers: each worker
// takes one contiguous, even share of the tiles (shared-nothing, as the step
// engine does), and worker 0 (the calling thread, which owns the I/O engine)
// may feed the engine between its tiles so reads and writes keep flowing
// while every core computes.
//
//   RunTiles(pool, layout.tiles(sg), [&](int worker, int64_t tile) { Update(sg, tile); },
//            [&] { pipeline.Pump(); });
#ifndef ZO_OFFLOAD_TIER_TILE_RUNNER_H_
#define ZO_OFFLOAD_TIER_TILE_RUNNER_H_

#include <cstdint>
#include <functional>

#include "offload/thread_pool.h"

namespace zo {

// fn(worker, tile) for every tile in [0, count), on pool's workers; `pump`,
// if set, runs on worker 0 (the calling thread) before each of its tiles and
// once more when its share is done. Returns when all are done. `fn` must be
// safe to call concurrently on different tiles. With `max_workers` > 0 only
// the first that many workers take tiles (the rest return at once, leaving
// their cores to other work).
void RunTiles(ThreadPool* pool, int64_t count, const std::function<void(int, int64_t)>& fn,
              const std::function<void()>& pump = nullptr, int max_workers = 0);

}  // namespace zo

#endif  // ZO_OFFLOAD_TIER_TILE_RUNNER_H_
