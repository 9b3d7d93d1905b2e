#include "server/step_coordinator.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "server/group_hyper.h"

namespace zo {

StepInputs InputsOf(const v1::StepCommit& commit) {
  StepInputs in = {.grad_multiplier = commit.grad_multiplier(),
                   .lr = commit.lr(),
                   .group_lr = {commit.group_lr().begin(), commit.group_lr().end()},
                   .group_hyper = {},
                   .applied_steps = commit.applied_steps()};
  for (const v1::GroupHyper& g : commit.group_hyper()) in.group_hyper.push_back(GroupHyperOf(g));
  return in;
}

StepCoordinator::StepCoordinator(Options options)
    : job_(options.job),
      map_(*options.map),
      server_index_(options.server_index),
      options_(std::move(options)) {
  absl::MutexLock lock(&mu_);
  if (is_lead()) {
    decider_.emplace(*options_.config, options_.dp_world_size);
  } else if (options_.config != nullptr) {
    follower_schedule_.emplace(LrSchedule::FromConfig(*options_.config));
  }
}

std::optional<StepInputs> StepCoordinator::GuessUnclipped(double loss_scale_used) const {
  absl::MutexLock lock(&mu_);
  std::optional<StepInputs> guess;
  if (decider_.has_value()) {
    guess = decider_->Unclipped(loss_scale_used);
  } else if (follower_applied_.has_value() && follower_schedule_.has_value()) {
    guess = UnclippedStepInputs(*follower_schedule_, options_.dp_world_size, *follower_applied_,
                                loss_scale_used);
  }
  if (guess.has_value() && options_.config != nullptr && options_.config->zo.client_lr) {
    auto it = client_lr_.find(open_step_);
    if (it == client_lr_.end()) return std::nullopt;
    guess->lr = it->second.lr.front();
    guess->group_lr = it->second.lr;
    guess->group_hyper = it->second.hyper;
  }
  return guess;
}

// ---------------------------------------------------------------- lead

std::optional<v1::StepCommit> StepCoordinator::LeadRound(const v1::StepStats& own,
                                                         double loss_scale_used) {
  const int64_t step = own.step();
  const int64_t generation = own.generation();
  if (absl::Status s = OnStepStats(own); !s.ok()) {
    ZO_LOG(WARNING) << "job " << job_ << ": own statistics of step " << step << " refused: " << s;
  }
  v1::StepCommit commit;
  {
    absl::MutexLock lock(&mu_);
    const size_t servers = static_cast<size_t>(map_.num_servers());
    auto gathered = [&]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
      return AbortedLocked(generation) || partials_[step].size() == servers;
    };
    while (!mu_.AwaitWithTimeout(absl::Condition(&gathered), options_.probe_every)) {
      if (!options_.probe) continue;
      std::vector<int> missing;
      for (int i = 1; i < map_.num_servers(); ++i) {
        if (partials_[step].count(i) == 0) missing.push_back(i);
      }
      mu_.Unlock();  // the probe calls another server
      for (int i : missing) options_.probe(i);
      mu_.Lock();
    }
    if (AbortedLocked(generation)) return std::nullopt;
    // Chunk order, whatever server reported it.
    std::map<int64_t, double> by_chunk;
    bool non_finite = false;
    for (const auto& [server, s] : partials_[step]) {
      for (int k = 0; k < s.chunks_size() && k < s.chunk_sum_squares_size(); ++k) {
        by_chunk[s.chunks(k)] = s.chunk_sum_squares(k);
      }
      non_finite = non_finite || s.non_finite();
    }
    partials_.erase(partials_.begin(), partials_.upper_bound(step));
    std::vector<double> sums;
    sums.reserve(by_chunk.size());
    for (const auto& [chunk, sum] : by_chunk) sums.push_back(sum);
    std::optional<ClientRates> rates;
    if (options_.config->zo.client_lr) {
      if (auto it = client_lr_.find(step); it != client_lr_.end()) rates = it->second;
      client_lr_.erase(client_lr_.begin(), client_lr_.upper_bound(step));
    }
    if (options_.config->zo.client_lr && !rates.has_value()) {
      // A skip that fails the job: no step is applied with rates nobody gave.
      commit.set_skip(true);
      commit.set_applied_steps(decider_->applied_steps());
      commit.set_next_loss_scale(decider_->scaler().scale());
      commit.set_failure(absl::StrCat(
          "job ", job_, ": zo.client_lr is set and no worker sent the learning rates of step ",
          step,
          " (SetStepLr before its gradients); restore the job and attach a client that "
          "sends them"));
    } else {
      const StepDecision d = decider_->Decide(sums, non_finite, loss_scale_used);
      commit.set_skip(d.skip);
      commit.set_grad_multiplier(d.grad_multiplier);
      commit.set_lr(d.lr);
      commit.set_applied_steps(d.applied_steps);
      commit.set_next_loss_scale(d.next_loss_scale);
      commit.set_grad_norm(d.grad_norm);
      if (!d.failure.ok()) {
        commit.set_failure(absl::StrCat("job ", job_, ": ", d.failure.message()));
      }
      if (rates.has_value() && !d.skip) {
        commit.set_lr(rates->lr.front());
        for (double lr : rates->lr) commit.add_group_lr(lr);
        for (const ParamGroupConfig& g : rates->hyper) {
          *commit.add_group_hyper() = GroupHyperProto(g);
        }
      }
    }
    commit.set_job(job_);
    commit.set_step(step);
    commit.set_generation(generation);
  }
  for (int i = 1; i < map_.num_servers(); ++i) {
    const bool sent = RetryUntilAborted(generation, "sending the step's commit",
                                        [&] { return options_.send_commit(i, commit); });
    if (!sent) return std::nullopt;
  }
  return commit;
}

absl::Status StepCoordinator::OnStepLr(int64_t step, int dp_rank, absl::Span<const double> group_lr,
                                       absl::Span<const ParamGroupConfig> group_hyper) {
  if (!options_.config->zo.client_lr) {
    return absl::FailedPreconditionError(
        absl::StrCat("job ", job_,
                     " takes its learning rate from its config's optimizer and "
                     "scheduler (zo.client_lr is false): a worker's rates are not used"));
  }
  if (dp_rank < 0 || dp_rank >= options_.dp_world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("dp_rank ", dp_rank, " is outside [0, ", options_.dp_world_size, ")"));
  }
  if (static_cast<int>(group_lr.size()) != options_.num_groups) {
    return absl::InvalidArgumentError(absl::StrCat(group_lr.size(), " learning rates for job ",
                                                   job_, ", which has ", options_.num_groups,
                                                   " parameter groups"));
  }
  for (size_t g = 0; g < group_lr.size(); ++g) {
    if (!std::isfinite(group_lr[g]) || group_lr[g] < 0) {
      return absl::InvalidArgumentError(absl::StrCat("learning rate of parameter group ", g, " is ",
                                                     group_lr[g], ": must be finite and >= 0"));
    }
  }
  ZO_RETURN_IF_ERROR(CheckGroupHyper(group_hyper));
  absl::MutexLock lock(&mu_);
  if (step < open_step_) return absl::OkStatus();  // decided already: a re-sent step
  if (step > open_step_ + 2) {
    return absl::FailedPreconditionError(
        absl::StrCat("learning rates for step ", step, " while step ", open_step_, " is open"));
  }
  ClientRates sent = {.lr = {group_lr.begin(), group_lr.end()},
                      .hyper = {group_hyper.begin(), group_hyper.end()}};
  auto [it, first] = client_lr_.try_emplace(step, sent);
  if (!first && it->second.lr != sent.lr) {
    return absl::InvalidArgumentError(
        absl::StrCat("dp rank ", dp_rank, " sent learning rates [", absl::StrJoin(group_lr, ", "),
                     "] for step ", step, ", another rank sent [",
                     absl::StrJoin(it->second.lr, ", "), "]: every rank must set the same rates"));
  }
  if (!first && it->second.hyper != sent.hyper) {
    return absl::InvalidArgumentError(
        absl::StrCat("dp rank ", dp_rank, " sent other betas, eps or weight decay for step ", step,
                     " than another rank: every rank must set the same"));
  }
  return absl::OkStatus();
}

absl::Status StepCoordinator::CheckGroupHyper(
    absl::Span<const ParamGroupConfig> group_hyper) const {
  if (group_hyper.empty()) return absl::OkStatus();
  const Config& config = *options_.config;
  if (config.optimizer.type != OptimizerType::kAdam &&
      config.optimizer.type != OptimizerType::kAdamW) {
    return absl::FailedPreconditionError(
        absl::StrCat("job ", job_, " runs ", std::string(EnumName(config.optimizer.type)),
                     ": betas, eps and weight decay per step are for Adam and AdamW"));
  }
  if (config.zo.dpu.compensation != DpuCompensation::kNone) {
    return absl::FailedPreconditionError(
        absl::StrCat("job ", job_,
                     " has zo.dpu.compensation, whose terms take the job's own betas and "
                     "weight decay: they cannot change per step"));
  }
  if (static_cast<int>(group_hyper.size()) != options_.num_groups) {
    return absl::InvalidArgumentError(
        absl::StrCat(group_hyper.size(), " groups' betas, eps and weight decay for job ", job_,
                     ", which has ", options_.num_groups, " parameter groups"));
  }
  for (size_t g = 0; g < group_hyper.size(); ++g) {
    const ParamGroupConfig& h = group_hyper[g];
    const auto bad = [&](const char* what, double value, const char* rule) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, " of parameter group ", g, " is ", value, ": must be ", rule));
    };
    for (int b = 0; b < 2; ++b) {
      if (!(h.betas[b] >= 0 && h.betas[b] < 1)) {
        return bad(b == 0 ? "beta1" : "beta2", h.betas[b], "in [0, 1)");
      }
    }
    if (!(std::isfinite(h.eps) && h.eps > 0)) return bad("eps", h.eps, "finite and > 0");
    if (!(std::isfinite(h.weight_decay) && h.weight_decay >= 0)) {
      return bad("weight_decay", h.weight_decay, "finite and >= 0");
    }
  }
  return absl::OkStatus();
}

absl::Status StepCoordinator::OnStepStats(const v1::StepStats& stats) {
  if (!is_lead()) {
    return absl::FailedPreconditionError(
        absl::StrCat("step statistics sent to server ", server_index_, "; the lead is server 0"));
  }
  if (stats.server_index() < 0 || stats.server_index() >= map_.num_servers()) {
    return absl::InvalidArgumentError(
        absl::StrCat("server_index ", stats.server_index(), " is outside the job's server list"));
  }
  if (stats.chunks_size() != stats.chunk_sum_squares_size()) {
    return absl::InvalidArgumentError("chunks and chunk_sum_squares differ in length");
  }
  for (int64_t c : stats.chunks()) {
    if (c < 0 || c >= map_.num_chunks() || map_.ServerOfChunk(c) != stats.server_index()) {
      return absl::InvalidArgumentError(
          absl::StrCat("chunk ", c, " does not belong to server ", stats.server_index()));
    }
  }
  absl::MutexLock lock(&mu_);
  if (stats.generation() != generation_) return absl::OkStatus();  // from before a restore
  if (stats.step() < open_step_) return absl::OkStatus();          // a retry of a decided step
  if (stats.step() > open_step_ + 1) {
    return absl::FailedPreconditionError(absl::StrCat("statistics for step ", stats.step(),
                                                      " but the lead is at step ", open_step_));
  }
  partials_[stats.step()][stats.server_index()] = stats;
  return absl::OkStatus();
}

// ---------------------------------------------------------------- follower

std::optional<v1::StepCommit> StepCoordinator::FollowerRound(const v1::StepStats& own) {
  const int64_t step = own.step();
  const int64_t generation = own.generation();
  const bool reported = RetryUntilAborted(generation, "reporting step statistics to the lead",
                                          [&] { return options_.report_stats(own); });
  if (!reported) return std::nullopt;
  absl::MutexLock lock(&mu_);
  auto committed = [&]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return AbortedLocked(generation) || (commit_.has_value() && commit_->step() == step);
  };
  mu_.Await(absl::Condition(&committed));
  if (AbortedLocked(generation)) return std::nullopt;
  std::optional<v1::StepCommit> commit = std::move(commit_);
  commit_.reset();
  follower_applied_ = commit->applied_steps();
  return commit;
}

absl::Status StepCoordinator::OnCommit(const v1::StepCommit& commit) {
  absl::MutexLock lock(&mu_);
  if (commit.generation() != generation_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "commit of generation ", commit.generation(), " but this server is at generation ",
        generation_, " (a restore happened in between)"));
  }
  if (commit.step() < open_step_) return absl::OkStatus();  // a retry of an applied step
  if (commit.step() != open_step_) {
    return absl::FailedPreconditionError(
        absl::StrCat("commit for step ", commit.step(), " but the open step is ", open_step_));
  }
  commit_ = commit;
  return absl::OkStatus();
}

// ---------------------------------------------------------------- both

bool StepCoordinator::RetryUntilAborted(int64_t generation, const char* what,
                                        const std::function<absl::Status()>& call) {
  absl::Duration backoff = options_.initial_backoff;
  for (;;) {
    const absl::Status s = call();
    absl::MutexLock lock(&mu_);
    if (s.ok()) {
      stall_.reset();
      return true;
    }
    if (!stall_.has_value()) stall_ = Stall{what, s, absl::Now()};
    stall_->last_error = s;
    if (AbortedLocked(generation)) {
      stall_.reset();
      return false;
    }
    ZO_LOG(WARNING) << "job " << job_ << ": " << what << " failed, retrying: " << s;
    auto aborted = [&]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return AbortedLocked(generation); };
    if (mu_.AwaitWithTimeout(absl::Condition(&aborted), backoff)) return false;
    backoff = std::min(backoff * 2, absl::Seconds(2));
  }
}

std::string StepCoordinator::StallDescription() const {
  absl::MutexLock lock(&mu_);
  if (!stall_.has_value()) return "";
  return absl::StrCat(
      stall_->what, " failing for ",
      absl::FormatDuration(absl::Trunc(absl::Now() - stall_->since, absl::Seconds(1))), ": ",
      stall_->last_error.ToString());
}

void StepCoordinator::Advance(int64_t step) {
  absl::MutexLock lock(&mu_);
  open_step_ = std::max(open_step_, step + 1);
  // A follower's rates of decided steps (the lead's round took its own).
  client_lr_.erase(client_lr_.begin(), client_lr_.upper_bound(step));
}

void StepCoordinator::Restart(int64_t generation, int64_t open_step) {
  absl::MutexLock lock(&mu_);
  generation_ = generation;
  open_step_ = open_step;
  commit_.reset();
  partials_.clear();
  client_lr_.clear();
  follower_applied_.reset();
}

void StepCoordinator::Stop() {
  absl::MutexLock lock(&mu_);
  stop_ = true;
}

int64_t StepCoordinator::applied_steps() const {
  absl::MutexLock lock(&mu_);
  return decider_.has_value() ? decider_->applied_steps() : 0;
}

LossScalerState StepCoordinator::scaler_state() const {
  absl::MutexLock lock(&mu_);
  return decider_.has_value() ? decider_->scaler().state() : LossScalerState{};
}

absl::Status StepCoordinator::RestoreDecider(int64_t applied_steps, const LossScalerState& scaler) {
  absl::MutexLock lock(&mu_);
  if (!decider_.has_value()) {
    return absl::FailedPreconditionError("only the lead server keeps the step decider");
  }
  return decider_->Restore(applied_steps, scaler);
}

}  // namespace zo
