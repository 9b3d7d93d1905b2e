// What a server keeps for zo.dpu.compensation "worker"
// (common/dpu_compensation.h): each step's decision as the lead sent it,
// and Adam's v summed over each tensor part this server holds after each
// update; and the workers' calls that wait for a step's decision to get
// their terms (GetStepCompensation).
//
// The step thread records; the calls read. The sums come from the update's
// tiles (on the pool's workers, concurrently) and are added in tile order
// once the update ends, so the same run gives the same bits. After a
// restore nothing is known until the next update: the first step's terms
// then carry no v (no gradient part) and no momentum; a step decided
// before the restore (the checkpoint keeps no decisions) is answered at
// once with terms that leave the version as pulled, as a skipped step's.
//
// Thread-safe.
#ifndef ZO_SERVER_COMPENSATION_RECORD_H_
#define ZO_SERVER_COMPENSATION_RECORD_H_

#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/dpu_compensation.h"

namespace zo {

class CompensationRecord {
 public:
  // One tensor's part on this server: elements [begin, begin + length) of
  // its local index space, with its group's hyper-parameters.
  struct Part {
    int32_t tensor = 0;
    int64_t begin = 0;
    int64_t length = 0;
    int group = 0;
    CompensationHyperParams hp;
  };
  explicit CompensationRecord(std::vector<Part> parts);

  // ---- the step thread
  // Step `step` was decided: `grad_multiplier` is what one rank's
  // gradient is multiplied by (the step's, times the dp ranks: a worker
  // compensates with its own); `group_lr` one per group; `applied_steps`
  // counts it when it is applied (StepCommit's).
  void Decided(int64_t step, bool skipped, double grad_multiplier, int64_t applied_steps,
               std::vector<double> group_lr);
  // The tiles of the update under way (concurrently, disjoint tiles).
  void AddTile(int64_t offset, int64_t n, const float* v);
  // `step`'s update ended; `made`: the state is after it (a skipped step
  // leaves v as it was).
  void UpdateEnded(int64_t step, bool made, bool skipped);
  // A restore replaced the state with version `restored_version`'s:
  // nothing recorded holds, and steps up to it will not be decided here.
  void Forget(int64_t restored_version);
  // Calls that wait fail with `reason`, now and later.
  void Stop(absl::Status reason);

  // ---- the workers' calls
  // Once `step` is decided (at most until `deadline`): the terms of every
  // tensor part here; at once for a step before the last restore (the
  // version as it is). DEADLINE_EXCEEDED, or Stop's reason.
  absl::StatusOr<std::vector<CompensationTerms>> Await(int64_t step, absl::Time deadline);

 private:
  struct Decision {
    bool skipped = false;
    double grad_multiplier = 0;
    int64_t applied_steps = 0;
    std::vector<double> group_lr;
  };

  const std::vector<Part> parts_;
  std::mutex mu_;
  std::condition_variable decided_cv_;
  std::map<int64_t, Decision> decisions_;  // the last few; guarded by mu_
  int64_t restored_version_ = -1;          // the last restore's; guarded by mu_
  // v summed per part after version k (the last few); guarded by mu_.
  std::map<int64_t, std::vector<double>> v_sums_;
  // Of the update under way: per part, (tile offset, sum); guarded by tiles_mu_.
  std::mutex tiles_mu_;
  std::vector<std::vector<std::pair<int64_t, double>>> tile_sums_;
  absl::Status stopped_;  // guarded by mu_
};

}  // namespace zo

#endif  // ZO_SERVER_COMPENSATION_RECORD_H_
