// What became of each step on the servers (applied or skipped, its gradient
// norm and lr), pieced together from JobStatus replies taken whenever the
// worker asks. With DPU the worker finishes step s while the servers may
// still be on s - 1, so a reply names the last finished version, not the
// step just pushed; the skip counter (version - applied_steps) fills in a
// step that no reply named. Replies may jump several versions (with DPU a
// reply after step s can name s - 2 and the next one s + 1): a step between
// two replies follows from their counters when they say no step or every
// step between them was skipped; otherwise it stays unknown for good.
#ifndef ZO_WORKER_TRAIN_STEP_OUTCOMES_H_
#define ZO_WORKER_TRAIN_STEP_OUTCOMES_H_

#include <cstdint>
#include <map>
#include <optional>

namespace zo::train {

struct StepOutcome {
  bool skipped = false;
  std::optional<double> grad_norm;  // known only when a reply named the step
  std::optional<double> lr;
};

class StepOutcomes {
 public:
  // A JobStatus reply: `version` finished steps, `applied_steps` of them
  // applied; last_* describe step `version`.
  void Observe(int64_t version, int64_t applied_steps, bool last_skipped, double last_grad_norm,
               double last_lr);

  // Empty until the replies so far determine step `step`.
  std::optional<StepOutcome> Get(int64_t step) const;

  // Whether the last reply is past `step`: its outcome, if still unknown,
  // will not become known (later replies name later versions).
  bool Passed(int64_t step) const { return latest_version_ > step; }

 private:
  int64_t latest_version_ = 0;
  std::map<int64_t, int64_t> skipped_through_;  // version -> steps skipped up to it
  std::map<int64_t, StepOutcome> named_;        // steps a reply described
};

}  // namespace zo::train

#endif  // ZO_WORKER_TRAIN_STEP_OUTCOMES_H_
