// What zo-train's metrics endpoint (--metrics-listen) shows: running totals
// of the steps this process ran — step time split (compute, push, waiting
// for weights, pipeline transfers, the rest), samples and tokens, gradient and weight
// bytes exchanged with the servers — and the last step's loss and loss
// scale. Names start with zo_train_; docs/metrics.md lists them.
#ifndef ZO_WORKER_TRAIN_TRAIN_METRICS_H_
#define ZO_WORKER_TRAIN_TRAIN_METRICS_H_

#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "prometheus/collectable.h"
#include "prometheus/metric_family.h"
#include "worker/train/progress.h"

namespace zo::train {

// Thread-safe: the training loop records, scrapes collect.
class TrainMetrics : public prometheus::Collectable {
 public:
  // Labels every sample: zo_job (the job on the servers; Prometheus keeps
  // "job" for its scrape job), stage (or "all") and dp_rank.
  TrainMetrics(std::string job, std::string stage, int dp_rank);

  // A finished step, and the client's byte totals after it.
  void Record(const StepReport& report, int64_t pushed_bytes, int64_t pulled_bytes);

  std::vector<prometheus::MetricFamily> Collect() const override;

 private:
  const std::string job_;
  const std::string stage_;
  const std::string dp_rank_;

  mutable std::mutex mu_;
  int64_t steps_ = 0;
  int64_t last_step_ = 0;
  double compute_s_ = 0;
  double push_s_ = 0;
  double wait_s_ = 0;
  double transfer_s_ = 0;
  double other_s_ = 0;
  int64_t samples_ = 0;
  int64_t tokens_ = 0;
  int64_t pushed_bytes_ = 0;
  int64_t pulled_bytes_ = 0;
  std::optional<double> loss_;
  double loss_scale_ = 1;
};

}  // namespace zo::train

#endif  // ZO_WORKER_TRAIN_TRAIN_METRICS_H_
