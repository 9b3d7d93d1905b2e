// The server's side of the in-process route (rpc/in_process_route.h): the
// jobs of one server's registry, reached by a client in the same process
// without the PushGradients and PullParams streams. The checks are the
// handlers' (Job::TryPushGradient, Job::OpenPull), so a piece the route
// takes is one the stream would have taken.
//
// Thread-safe. Detach() (the server shutting down) makes every later call
// UNAVAILABLE; calls in progress finish first.
#ifndef ZO_SERVER_EMBEDDED_ROUTE_H_
#define ZO_SERVER_EMBEDDED_ROUTE_H_

#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <string>
#include <utility>

#include "rpc/in_process_route.h"
#include "server/job_registry.h"

namespace zo {

class EmbeddedRoute final : public InProcessRoute {
 public:
  // `registry` must outlive the route or Detach().
  explicit EmbeddedRoute(JobRegistry* registry) : registry_(registry) {}

  absl::StatusOr<PushOutcome> TryPush(const v1::GradientPiece& header,
                                      absl::Span<const std::byte> data, PushWait* wait,
                                      std::function<void()> wake,
                                      std::shared_ptr<const void> lent) override;
  absl::StatusOr<absl::Span<std::byte>> LendGradientPlace(const v1::GradientPiece& header,
                                                          int64_t elems) override;
  bool CancelPushWait(const v1::GradientPiece& header, const PushWait& wait) override;
  absl::StatusOr<bool> AwaitVersion(const std::string& job, int64_t version, uint64_t incarnation,
                                    std::function<void()> wake, uint64_t* ticket) override;
  bool CancelVersionWait(const std::string& job, uint64_t ticket) override;
  absl::StatusOr<PullResult> PullInto(const v1::PullParamsRequest& request, Place place) override;
  absl::StatusOr<uint64_t> RegisterPull(const v1::PullParamsRequest& request, Place place) override;
  absl::StatusOr<std::optional<PullResult>> TakeFilledPull(const v1::PullParamsRequest& request,
                                                           uint64_t id) override;
  void WithdrawPull(uint64_t id) override;
  absl::Status SetStepLr(const v1::StepLrRequest& request) override;

  void Detach();

 private:
  // The job, or UNAVAILABLE once detached / the registry's NOT_FOUND.
  // Requires mu_ (shared).
  absl::StatusOr<std::shared_ptr<Job>> FindLocked(const std::string& job) const;

  // The registration `id` taken out of registered_, or {null, 0}.
  std::pair<std::shared_ptr<Job>, PullFills::Id> TakeRegistration(uint64_t id);

  mutable std::shared_mutex mu_;
  JobRegistry* registry_;  // guarded by mu_; null once detached
  // Registered pulls by route id, each with its job, which an update could
  // still write from even once the job is closed: it stays until the
  // registration ends.
  std::mutex registered_mu_;
  std::map<uint64_t, std::pair<std::shared_ptr<Job>, PullFills::Id>> registered_;
  uint64_t next_registration_ = 1;
};

}  // namespace zo

#endif  // ZO_SERVER_EMBEDDED_ROUTE_H_
