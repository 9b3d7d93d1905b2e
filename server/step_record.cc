#include "server/step_record.h"

#include <iterator>

namespace zo {

double StepRecord::ScaleFor(int64_t version) const {
  auto it = scale_after_version_.upper_bound(version);
  if (it == scale_after_version_.begin()) return scale_after_version_.begin()->second;
  return std::prev(it)->second;
}

void StepRecord::Record(const v1::StepCommit& commit) {
  applied_steps_ = commit.applied_steps();
  last_grad_norm_ = commit.grad_norm();
  last_skipped_ = commit.skip();
  if (!commit.skip()) {
    last_lr_ = commit.lr();
    last_group_lr_.assign(commit.group_lr().begin(), commit.group_lr().end());
    last_group_hyper_.clear();
    for (const v1::GroupHyper& g : commit.group_hyper()) {
      last_group_hyper_.push_back(GroupHyperOf(g));
    }
  }
  scale_after_version_[commit.step()] = commit.next_loss_scale();
  while (scale_after_version_.size() > kScaleHistory) {
    scale_after_version_.erase(scale_after_version_.begin());
  }
}

void StepRecord::Restore(const CheckpointMeta& meta, const LastStep& last, bool keeps_previous) {
  applied_steps_ = meta.applied_steps;
  scale_after_version_ = {{meta.version, meta.loss_scale}};
  if (keeps_previous) scale_after_version_[meta.version - 1] = meta.previous_loss_scale;
  last_grad_norm_ = last.grad_norm;
  last_lr_ = last.lr;
  last_group_lr_ = meta.last_group_lr;
  last_group_hyper_ = meta.last_group_hyper;
  last_skipped_ = last.skipped;
}

void StepRecord::Describe(CheckpointMeta& meta) const {
  meta.has_last_step = true;
  meta.last_grad_norm = last_grad_norm_;
  meta.last_lr = last_lr_;
  meta.last_group_lr = last_group_lr_;
  meta.last_group_hyper = last_group_hyper_;
  meta.last_skipped = last_skipped_;
}

void StepRecord::AddTo(v1::JobStatus& status, int64_t version) const {
  status.set_applied_steps(applied_steps_);
  status.set_loss_scale(ScaleFor(version));
  status.set_last_grad_norm(last_grad_norm_);
  status.set_last_skipped(last_skipped_);
  status.set_last_lr(last_lr_);
}

}  // namespace zo
