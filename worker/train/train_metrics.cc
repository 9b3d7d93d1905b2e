#include "worker/train/train_metrics.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/metric_families.h"

namespace zo::train {
namespace {

using prometheus::ClientMetric;
using prometheus::MetricFamily;
using prometheus::MetricType;

}  // namespace

TrainMetrics::TrainMetrics(std::string job, std::string stage, int dp_rank)
    : job_(std::move(job)), stage_(std::move(stage)), dp_rank_(absl::StrCat(dp_rank)) {}

void TrainMetrics::Record(const StepReport& r, int64_t pushed_bytes, int64_t pulled_bytes) {
  std::lock_guard lock(mu_);
  ++steps_;
  last_step_ = r.step;
  compute_s_ += r.compute_s;
  // The parts are disjoint waits inside the step; the rest of it (data,
  // bookkeeping) is `other`, so that a sum over phase is the step.
  other_s_ += std::max(0.0, r.step_s - (r.compute_s + r.push_s + r.wait_s + r.transfer_s));
  push_s_ += r.push_s;
  wait_s_ += r.wait_s;
  transfer_s_ += r.transfer_s;
  samples_ += r.samples;
  tokens_ += r.tokens;
  pushed_bytes_ = pushed_bytes;
  pulled_bytes_ = pulled_bytes;
  if (r.loss) loss_ = r.loss;
  loss_scale_ = r.loss_scale;
}

std::vector<MetricFamily> TrainMetrics::Collect() const {
  const std::vector<ClientMetric::Label> id = {
      {"zo_job", job_}, {"stage", stage_}, {"dp_rank", dp_rank_}};
  auto with = [&](const char* name, const char* value) {
    std::vector<ClientMetric::Label> l = id;
    l.push_back({name, value});
    return l;
  };
  std::lock_guard lock(mu_);
  MetricFamilies f;
  AddSample(f.Add("zo_train_steps_total", "steps this process ran", MetricType::Counter), id,
            static_cast<double>(steps_));
  AddSample(f.Add("zo_train_step", "the last step finished", MetricType::Gauge), id,
            static_cast<double>(last_step_));
  MetricFamily& seconds =
      f.Add("zo_train_step_seconds_total",
            "step time by phase, which sum to the steps' time: compute (forward/backward), push "
            "(waiting for the servers to take the gradients), wait_weights (waiting for the next "
            "weights), pipeline (waiting on neighbouring stages), other (the rest)",
            MetricType::Counter);
  AddSample(seconds, with("phase", "compute"), compute_s_);
  AddSample(seconds, with("phase", "push"), push_s_);
  AddSample(seconds, with("phase", "wait_weights"), wait_s_);
  AddSample(seconds, with("phase", "pipeline"), transfer_s_);
  AddSample(seconds, with("phase", "other"), other_s_);
  AddSample(f.Add("zo_train_samples_total", "sequences (GPT) or samples (MLP) trained on",
                  MetricType::Counter),
            id, static_cast<double>(samples_));
  AddSample(f.Add("zo_train_tokens_total", "tokens trained on (GPT)", MetricType::Counter), id,
            static_cast<double>(tokens_));
  MetricFamily& bytes = f.Add(
      "zo_train_bytes_total",
      "payload bytes with the servers: direction=out gradients pushed, direction=in weights pulled",
      MetricType::Counter);
  AddSample(bytes, with("direction", "out"), static_cast<double>(pushed_bytes_));
  AddSample(bytes, with("direction", "in"), static_cast<double>(pulled_bytes_));
  AddSample(f.Add("zo_train_loss_scale", "loss scale of the last step", MetricType::Gauge), id,
            loss_scale_);
  if (loss_) {  // only the process holding the last stage sees the loss
    AddSample(f.Add("zo_train_loss", "loss of the last step", MetricType::Gauge), id, *loss_);
  }
  return f.Take();
}

}  // namespace zo::train
