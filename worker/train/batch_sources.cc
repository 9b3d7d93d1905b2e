#include "worker/train/batch_sources.h"

#include "common/status_macros.h"

namespace zo::train {

TextBatchSource::TextBatchSource(const CharDataset& data, int micro_batch_size, int block_size,
                                 int micro_batches, int dp_rank, int dp_world)
    : data_(data),
      micro_batch_size_(micro_batch_size),
      block_size_(block_size),
      micro_batches_(micro_batches),
      dp_rank_(dp_rank),
      dp_world_(dp_world) {}

absl::StatusOr<model::MicroBatch> TextBatchSource::Get(int64_t step, int micro_batch) {
  // Each micro-batch is its own sampling index, so which stage asks first
  // (stage 0 for tokens, the last stage for targets) changes nothing.
  const uint64_t index = static_cast<uint64_t>(step) * micro_batches_ + micro_batch;
  ZO_ASSIGN_OR_RETURN(CharBatch batch,
                      data_.Sample(micro_batch_size_, block_size_, index, dp_rank_, dp_world_));
  model::MicroBatch mb;
  mb.batch = batch.batch;
  mb.block_size = batch.block_size;
  mb.tokens = std::move(batch.tokens);
  mb.targets = std::move(batch.targets);
  return mb;
}

MlpBatchSource::MlpBatchSource(const model::MlpConfig& config, uint64_t seed, int micro_batch_size,
                               int dp_rank)
    : config_(config), seed_(seed), micro_batch_size_(micro_batch_size), dp_rank_(dp_rank) {}

absl::StatusOr<model::MicroBatch> MlpBatchSource::Get(int64_t step, int micro_batch) {
  return model::MlpMicroBatch(config_, seed_, step, micro_batch, dp_rank_, micro_batch_size_);
}

}  // namespace zo::train
