#include "worker/train/progress.h"

#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "nlohmann/json.hpp"

namespace zo::train {
namespace {

std::string Rate(double per_s) {
  if (per_s >= 1e6) return absl::StrFormat("%.2fM", per_s / 1e6);
  if (per_s >= 1e3) return absl::StrFormat("%.1fk", per_s / 1e3);
  return absl::StrFormat("%.1f", per_s);
}

}  // namespace

absl::StatusOr<Progress> Progress::Open(std::FILE* out, int64_t first_step, int64_t total_steps,
                                        int steps_per_print, const std::string& metrics_path) {
  Progress progress(out, first_step, total_steps, steps_per_print, metrics_path,
                    isatty(fileno(out)) == 1);
  if (!metrics_path.empty()) {
    // Append: a restarted worker continues the same file.
    progress.metrics_ = std::fopen(metrics_path.c_str(), "a");
    if (progress.metrics_ == nullptr) {
      return absl::FailedPreconditionError(absl::StrCat("cannot open --metrics-out file ",
                                                        metrics_path, ": ", std::strerror(errno)));
    }
  }
  return progress;
}

Progress::Progress(std::FILE* out, int64_t first_step, int64_t total_steps, int steps_per_print,
                   std::string metrics_path, bool bar)
    : out_(out),
      first_step_(first_step),
      total_steps_(total_steps),
      steps_per_print_(steps_per_print),
      metrics_path_(std::move(metrics_path)),
      bar_(bar) {}

void Progress::DrawBar(const StepReport& r) {
  constexpr int kWidth = 30;
  const int64_t span = std::max<int64_t>(1, total_steps_ - first_step_ + 1);
  const int filled = static_cast<int>(kWidth * (r.step - first_step_ + 1) / span);
  std::string bar(filled, '#');
  bar.resize(kWidth, '.');
  std::fprintf(out_, "\r[%s] %lld/%lld%s", bar.c_str(), static_cast<long long>(r.step),
               static_cast<long long>(total_steps_),
               r.loss ? absl::StrFormat(" loss %.4f", *r.loss).c_str() : "");
  std::fflush(out_);
}

absl::Status Progress::Step(const StepReport& r, const StepOutcomes& outcomes) {
  ++steps_;
  seconds_ += r.step_s;
  samples_ += r.samples;
  tokens_ += r.tokens;
  if (r.loss) {
    if (!first_loss_) first_loss_ = r.loss;
    last_loss_ = r.loss;
    if (!best_loss_ || *r.loss < *best_loss_) best_loss_ = r.loss;
  }
  if (r.step % steps_per_print_ == 0 || r.step == total_steps_ || r.step == first_step_) {
    const double rate = r.step_s > 0 ? (r.tokens > 0 ? r.tokens : r.samples) / r.step_s : 0;
    std::string line = absl::StrFormat(
        "step %*d/%d", static_cast<int>(absl::StrCat(total_steps_).size()), r.step, total_steps_);
    if (r.loss) absl::StrAppendFormat(&line, " | loss %.4f", *r.loss);
    absl::StrAppend(&line, " | ", Rate(rate), r.tokens > 0 ? " tokens/s" : " samples/s");
    absl::StrAppendFormat(&line, " | scale %g", r.loss_scale);
    absl::StrAppendFormat(&line, " | step %.3fs (compute %.3f, push %.3f, wait for weights %.3f",
                          r.step_s, r.compute_s, r.push_s, r.wait_s);
    if (r.transfer_s > 0) absl::StrAppendFormat(&line, ", pipeline %.3f", r.transfer_s);
    line += ")";
    if (std::optional<StepOutcome> o = outcomes.Get(r.step); o && o->skipped) {
      line += " | skipped (overflow)";
    }
    std::fprintf(out_, "%s%s\n", bar_ ? "\r\33[2K" : "", line.c_str());
    // A pipe or file is fully buffered: without this, `zo-train | tee log`
    // shows nothing until exit and a killed run leaves no log.
    std::fflush(out_);
  }
  if (bar_) DrawBar(r);
  if (metrics_ != nullptr) {
    pending_.push_back(r);
    return FlushMetrics(outcomes, false);
  }
  return absl::OkStatus();
}

absl::Status Progress::FlushMetrics(const StepOutcomes& outcomes, bool final) {
  while (!pending_.empty()) {
    const StepReport& r = pending_.front();
    std::optional<StepOutcome> outcome = outcomes.Get(r.step);
    // Unknown for good once the servers are past it: written without, like
    // at the end, rather than holding back every line after it.
    if (!outcome && !final && !outcomes.Passed(r.step)) break;
    nlohmann::json j;
    j["step"] = r.step;
    j["loss"] = r.loss ? nlohmann::json(*r.loss) : nlohmann::json(nullptr);
    j["loss_scale"] = r.loss_scale;
    j["skipped"] = outcome ? nlohmann::json(outcome->skipped) : nlohmann::json(nullptr);
    if (outcome && outcome->grad_norm) j["grad_norm"] = *outcome->grad_norm;
    if (outcome && outcome->lr) j["lr"] = *outcome->lr;
    j["step_s"] = r.step_s;
    j["samples_per_s"] = r.step_s > 0 ? r.samples / r.step_s : 0.0;
    if (r.tokens > 0) j["tokens_per_s"] = r.step_s > 0 ? r.tokens / r.step_s : 0.0;
    j["compute_s"] = r.compute_s;
    j["push_s"] = r.push_s;
    j["wait_s"] = r.wait_s;
    j["pipeline_s"] = r.transfer_s;
    const std::string text = j.dump() + "\n";
    if (std::fputs(text.c_str(), metrics_) < 0 || std::fflush(metrics_) != 0) {
      return absl::DataLossError(
          absl::StrCat("writing --metrics-out file ", metrics_path_, ": ", std::strerror(errno)));
    }
    pending_.pop_front();
  }
  return absl::OkStatus();
}

void Progress::Note(const std::string& line) {
  std::fprintf(out_, "%s%s\n", bar_ ? "\r\33[2K" : "", line.c_str());
  std::fflush(out_);
}

absl::Status Progress::Finish(const StepOutcomes& outcomes) {
  absl::Status flushed = absl::OkStatus();
  if (metrics_ != nullptr) {
    flushed = FlushMetrics(outcomes, true);
    std::fclose(metrics_);
    metrics_ = nullptr;
  }
  if (bar_) std::fprintf(out_, "\r\33[2K");
  std::string summary = absl::StrFormat("trained %d steps in %.1fs", steps_, seconds_);
  if (seconds_ > 0) {
    absl::StrAppend(&summary, " (", Rate((tokens_ > 0 ? tokens_ : samples_) / seconds_),
                    tokens_ > 0 ? " tokens/s" : " samples/s", ")");
  }
  if (first_loss_) {
    absl::StrAppendFormat(&summary, "; loss %.4f -> %.4f (best %.4f)", *first_loss_, *last_loss_,
                          *best_loss_);
  }
  int64_t skipped = 0;
  for (int64_t s = first_step_; s < first_step_ + steps_; ++s) {
    std::optional<StepOutcome> o = outcomes.Get(s);
    skipped += o && o->skipped;
  }
  if (skipped > 0) absl::StrAppend(&summary, "; ", skipped, " steps skipped (fp16 overflow)");
  std::fprintf(out_, "%s\n", summary.c_str());
  std::fflush(out_);
  return flushed;
}

}  // namespace zo::train
