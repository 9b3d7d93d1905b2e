// Where each model's micro-batches come from: random windows of a text for
// GPT-lite, the synthetic classification task for the MLP. Both are pure
// functions of (seed, step, micro-batch, dp rank), so pipeline stages in
// different processes and a restarted worker see the same batches.
#ifndef ZO_WORKER_TRAIN_BATCH_SOURCES_H_
#define ZO_WORKER_TRAIN_BATCH_SOURCES_H_

#include <cstdint>

#include "worker/data/char_dataset.h"
#include "worker/model/model.h"
#include "worker/model/model_stage.h"

namespace zo::train {

class TextBatchSource final : public model::BatchSource {
 public:
  // The dataset must outlive the source.
  TextBatchSource(const CharDataset& data, int micro_batch_size, int block_size, int micro_batches,
                  int dp_rank, int dp_world);
  absl::StatusOr<model::MicroBatch> Get(int64_t step, int micro_batch) override;

 private:
  const CharDataset& data_;
  int micro_batch_size_;
  int block_size_;
  int micro_batches_;
  int dp_rank_;
  int dp_world_;
};

class MlpBatchSource final : public model::BatchSource {
 public:
  MlpBatchSource(const model::MlpConfig& config, uint64_t seed, int micro_batch_size, int dp_rank);
  absl::StatusOr<model::MicroBatch> Get(int64_t step, int micro_batch) override;

 private:
  model::MlpConfig config_;
  uint64_t seed_;
  int micro_batch_size_;
  int dp_rank_;
};

}  // namespace zo::train

#endif  // ZO_WORKER_TRAIN_BATCH_SOURCES_H_
