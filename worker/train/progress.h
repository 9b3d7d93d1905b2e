// What zo-train shows while it trains: a line every steps_per_print steps,
// a progress bar when stdout is a terminal, a summary at the end, and with
// --metrics-out one JSON object per step (JSON lines) for plotting.
#ifndef ZO_WORKER_TRAIN_PROGRESS_H_
#define ZO_WORKER_TRAIN_PROGRESS_H_

#include <cstdint>
#include <cstdio>
#include <deque>
#include <fstream>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/train/step_outcomes.h"

namespace zo::train {

struct StepReport {
  int64_t step = 0;
  std::optional<double> loss = std::nullopt;  // this process holds the last stage
  double loss_scale = 1;
  double step_s = 0;
  double compute_s = 0;   // forward/backward, incl. casting and queueing gradients
  double push_s = 0;      // waiting for the servers to acknowledge the gradients
  double wait_s = 0;      // waiting for weights
  double transfer_s = 0;  // waiting on neighbouring stages
  int64_t samples = 0;    // sequences (GPT) or samples (MLP) of this step
  int64_t tokens = 0;     // samples x block_size (GPT); 0 for the MLP
};

class Progress {
 public:
  // `total_steps`: the last step number of the run. Writes human output to
  // `out`; `metrics_path` empty: no metrics file.
  static absl::StatusOr<Progress> Open(std::FILE* out, int64_t first_step, int64_t total_steps,
                                       int steps_per_print, const std::string& metrics_path);

  // One finished step; prints its line when it is due. Its metrics line
  // waits until `outcomes` knows whether the servers skipped it, or until
  // the servers are past it without that being known (then null).
  absl::Status Step(const StepReport& report, const StepOutcomes& outcomes);
  // A line of its own between the progress lines (clears the bar first).
  void Note(const std::string& line);
  // Writes the metrics lines still waiting (unknown outcomes as null) and the
  // summary.
  absl::Status Finish(const StepOutcomes& outcomes);

 private:
  Progress(std::FILE* out, int64_t first_step, int64_t total_steps, int steps_per_print,
           std::string metrics_path, bool bar);
  absl::Status FlushMetrics(const StepOutcomes& outcomes, bool final);
  void DrawBar(const StepReport& report);

  std::FILE* out_;
  int64_t first_step_;
  int64_t total_steps_;
  int steps_per_print_;
  std::string metrics_path_;
  std::FILE* metrics_ = nullptr;
  bool bar_;
  std::deque<StepReport> pending_;  // metrics lines waiting for their outcome
  // For the summary.
  int64_t steps_ = 0;
  double seconds_ = 0;
  int64_t samples_ = 0;
  int64_t tokens_ = 0;
  std::optional<double> first_loss_;
  std::optional<double> last_loss_;
  std::optional<double> best_loss_;
};

}  // namespace zo::train

#endif  // ZO_WORKER_TRAIN_PROGRESS_H_
