// What a job's steps left behind on one server: the loss scale after each
// of the newest versions (a pull of a version gets the scale its gradients
// are to carry), the count of applied steps, and the last step's gradient
// norm, learning rate(s), group settings and skip, as JobStatus shows them and a checkpoint
// keeps them.
//
// A value: not thread-safe on its own (JobPosition guards it with its mutex).
#ifndef ZO_SERVER_STEP_RECORD_H_
#define ZO_SERVER_STEP_RECORD_H_

#include <cstdint>
#include <map>
#include <vector>

#include "offload/checkpoint/checkpoint_dir.h"
#include "proto/zo/v1/coordination.pb.h"
#include "proto/zo/v1/job.pb.h"
#include "server/group_hyper.h"
#include "server/state_checkpoint.h"

namespace zo {

class StepRecord {
 public:
  // Loss scales kept: pulls ask for those of the few newest versions.
  static constexpr size_t kScaleHistory = 8;

  // A job at version 0, whose gradients carry `initial_scale`.
  explicit StepRecord(double initial_scale) { scale_after_version_[0] = initial_scale; }

  // The loss scale after `version` (the oldest kept for anything older).
  double ScaleFor(int64_t version) const;
  // The scale after `version`, known before its step is recorded (the
  // update writes it and pulls may read it meanwhile).
  void SetScale(int64_t version, double scale) { scale_after_version_[version] = scale; }
  // A decided step was applied.
  void Record(const v1::StepCommit& commit);
  // A restore of the checkpoint `meta` (with `last` read from it); with
  // `keeps_previous`, the version before it is served too, and its scale
  // comes back with it.
  void Restore(const CheckpointMeta& meta, const LastStep& last, bool keeps_previous);

  int64_t applied_steps() const { return applied_steps_; }
  // The commit record's last-step fields.
  void Describe(CheckpointMeta& meta) const;
  // JobStatus's: applied steps, the scale after `version`, the last step.
  void AddTo(v1::JobStatus& status, int64_t version) const;

 private:
  std::map<int64_t, double> scale_after_version_;  // the newest kScaleHistory
  int64_t applied_steps_ = 0;
  double last_grad_norm_ = 0.0;
  bool last_skipped_ = false;
  double last_lr_ = 0.0;
  std::vector<double> last_group_lr_;               // with zo.client_lr; else empty
  std::vector<ParamGroupConfig> last_group_hyper_;  // where the workers sent them
};

}  // namespace zo

#endif  // ZO_SERVER_STEP_RECORD_H_
