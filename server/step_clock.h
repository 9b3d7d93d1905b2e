// When a job's open step opened and how long the last one took, on one
// server: a step's wait for its gradients (the step log and the metrics),
// and how long a checkpoint's NVMe part may wait for the next step to
// carry it (OwnCheckpointPart::Finish).
//
// A value: not thread-safe on its own (JobPosition guards it with its mutex).
#ifndef ZO_SERVER_STEP_CLOCK_H_
#define ZO_SERVER_STEP_CLOCK_H_

#include "absl/time/time.h"

namespace zo {

class StepClock {
 public:
  explicit StepClock(absl::Time opened) : opened_(opened) {}

  // The open step starts over at `now` (a restore): its wait counts from here.
  void Reopen(absl::Time now) { opened_ = now; }
  // The open step, whose gradients were all in at `ready`, ended at `end`,
  // which opens the next: returns how long it waited for its gradients.
  absl::Duration Ended(absl::Time ready, absl::Time end) {
    const absl::Duration wait = ready - opened_;
    interval_ = end - opened_;
    opened_ = end;
    return wait;
  }
  // Opening to end of the last step that ended; zero before one has.
  absl::Duration interval() const { return interval_; }

 private:
  absl::Time opened_;
  absl::Duration interval_ = absl::ZeroDuration();
};

}  // namespace zo

#endif  // ZO_SERVER_STEP_CLOCK_H_
