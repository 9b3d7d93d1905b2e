// The GPU benchmark's batches: tokens from a fixed hash (GpuBenchToken), so
// a PyTorch twin can feed the same ones. Nothing to learn in them; the rows
// that need a falling loss train on text instead.
#ifndef ZO_BENCH_INTERNAL_HASH_TOKEN_SOURCE_H_
#define ZO_BENCH_INTERNAL_HASH_TOKEN_SOURCE_H_

#include <cstdint>

#include "bench/gpu_bench.h"
#include "worker/model/model_stage.h"

namespace zo::bench_internal {

class HashTokenSource final : public model::BatchSource {
 public:
  HashTokenSource(int batch, int block, int vocab) : batch_(batch), block_(block), vocab_(vocab) {}
  absl::StatusOr<model::MicroBatch> Get(int64_t step, int micro_batch) override {
    model::MicroBatch mb;
    mb.batch = batch_;
    mb.block_size = block_;
    const int64_t n = int64_t{batch_} * block_;
    for (int64_t i = 0; i < n; ++i) {
      mb.tokens.push_back(bench::GpuBenchToken(step, micro_batch, i, vocab_));
      mb.targets.push_back(bench::GpuBenchToken(step, micro_batch, i + 1, vocab_));
    }
    return mb;
  }

 private:
  int batch_, block_, vocab_;
};

}  // namespace zo::bench_internal

#endif  // ZO_BENCH_INTERNAL_HASH_TOKEN_SOURCE_H_
