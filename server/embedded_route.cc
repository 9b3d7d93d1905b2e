#include "server/embedded_route.h"

#include <mutex>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "server/gradient_piece_view.h"

namespace zo {
namespace {

GradientPieceView ViewOfSpan(const v1::GradientPiece& header, absl::Span<const std::byte> data) {
  GradientPieceView view = ViewOf(header);  // the header's fields; it has no data
  view.data = {{reinterpret_cast<const char*>(data.data()), data.size()}};
  view.data_bytes = data.size();
  return view;
}

}  // namespace

absl::StatusOr<std::shared_ptr<Job>> EmbeddedRoute::FindLocked(const std::string& job) const {
  if (registry_ == nullptr) return absl::UnavailableError("the embedded server has shut down");
  return registry_->Find(job);
}

absl::Status EmbeddedRoute::SetStepLr(const v1::StepLrRequest& request) {
  std::shared_lock lock(mu_);
  ZO_ASSIGN_OR_RETURN(std::shared_ptr<Job> job, FindLocked(request.job()));
  return job->OnStepLr(request);
}

absl::StatusOr<InProcessRoute::PushOutcome> EmbeddedRoute::TryPush(
    const v1::GradientPiece& header, absl::Span<const std::byte> data, PushWait* wait,
    std::function<void()> wake, std::shared_ptr<const void> lent) {
  std::shared_lock lock(mu_);
  ZO_ASSIGN_OR_RETURN(std::shared_ptr<Job> job, FindLocked(header.job()));
  GradientAccumulator::PushWait w{.resets = wait->resets, .ticket = wait->ticket};
  absl::StatusOr<GradientAccumulator::PushOutcome> outcome =
      job->TryPushGradient(ViewOfSpan(header, data), &w, std::move(wake), std::move(lent));
  *wait = {.resets = w.resets, .ticket = w.ticket};
  if (!outcome.ok()) return outcome.status();
  return *outcome == GradientAccumulator::PushOutcome::kAdded ? PushOutcome::kAdded
                                                              : PushOutcome::kWaiting;
}

absl::StatusOr<absl::Span<std::byte>> EmbeddedRoute::LendGradientPlace(
    const v1::GradientPiece& header, int64_t elems) {
  std::shared_lock lock(mu_);
  ZO_ASSIGN_OR_RETURN(std::shared_ptr<Job> job, FindLocked(header.job()));
  return job->LendGradientPlace(ViewOf(header), elems);
}

bool EmbeddedRoute::CancelPushWait(const v1::GradientPiece& header, const PushWait& wait) {
  std::shared_lock lock(mu_);
  absl::StatusOr<std::shared_ptr<Job>> job = FindLocked(header.job());
  // A job that is gone (or a server that stopped) has posted every wake.
  if (!job.ok()) return false;
  return (*job)->CancelPushWait(ViewOfSpan(header, {}),
                                {.resets = wait.resets, .ticket = wait.ticket});
}

absl::StatusOr<bool> EmbeddedRoute::AwaitVersion(const std::string& job, int64_t version,
                                                 uint64_t incarnation, std::function<void()> wake,
                                                 uint64_t* ticket) {
  std::shared_lock lock(mu_);
  *ticket = WaitList::kNone;
  ZO_ASSIGN_OR_RETURN(std::shared_ptr<Job> found, FindLocked(job));
  ZO_RETURN_IF_ERROR(found->CheckIncarnation(incarnation));
  if (version < 0) return absl::InvalidArgumentError(absl::StrCat("version ", version, " < 0"));
  return found->AwaitVersion(version, std::move(wake), ticket, /*while_written=*/true);
}

bool EmbeddedRoute::CancelVersionWait(const std::string& job, uint64_t ticket) {
  std::shared_lock lock(mu_);
  absl::StatusOr<std::shared_ptr<Job>> found = FindLocked(job);
  return found.ok() && (*found)->CancelVersionWait(ticket);
}

absl::StatusOr<InProcessRoute::PullResult> EmbeddedRoute::PullInto(
    const v1::PullParamsRequest& request, Place place) {
  const absl::Time start = absl::Now();
  std::shared_lock lock(mu_);
  ZO_ASSIGN_OR_RETURN(std::shared_ptr<Job> job, FindLocked(request.job()));
  ZO_ASSIGN_OR_RETURN(PullCursor cursor, job->OpenPull(request, /*while_written=*/true));
  ZO_RETURN_IF_ERROR(cursor.ReadInto(place));
  ZO_RETURN_IF_ERROR(job->AwaitWritten(request.version()));
  job->RecordPull(absl::Now() - start, cursor.bytes_given());
  return PullResult{.unchanged = cursor.unchanged(),
                    .loss_scale = cursor.loss_scale(),
                    .bytes = cursor.bytes_given()};
}

absl::StatusOr<uint64_t> EmbeddedRoute::RegisterPull(const v1::PullParamsRequest& request,
                                                     Place place) {
  std::shared_lock lock(mu_);
  ZO_ASSIGN_OR_RETURN(std::shared_ptr<Job> job, FindLocked(request.job()));
  ZO_RETURN_IF_ERROR(job->CheckIncarnation(request.incarnation()));
  ZO_ASSIGN_OR_RETURN(const PullFills::Id fill, job->RegisterPull(request, place));
  if (fill == 0) return 0;
  std::lock_guard registered(registered_mu_);
  const uint64_t id = next_registration_++;
  registered_.emplace(id, std::make_pair(std::move(job), fill));
  return id;
}

std::pair<std::shared_ptr<Job>, PullFills::Id> EmbeddedRoute::TakeRegistration(uint64_t id) {
  std::lock_guard lock(registered_mu_);
  auto it = registered_.find(id);
  if (it == registered_.end()) return {nullptr, 0};
  auto taken = std::move(it->second);
  registered_.erase(it);
  return taken;
}

absl::StatusOr<std::optional<InProcessRoute::PullResult>> EmbeddedRoute::TakeFilledPull(
    const v1::PullParamsRequest& request, uint64_t id) {
  auto [job, fill] = TakeRegistration(id);
  if (job == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("no pull registered as ", id));
  }
  ZO_ASSIGN_OR_RETURN(std::optional<PullResult> filled,
                      job->TakeFilledPull(request.version(), fill));
  if (filled.has_value())
    job->RecordPull(absl::ZeroDuration(), filled->bytes);  // the update's time
  return filled;
}

void EmbeddedRoute::WithdrawPull(uint64_t id) {
  auto [job, fill] = TakeRegistration(id);
  if (job != nullptr) job->WithdrawPull(fill);
}

void EmbeddedRoute::Detach() {
  std::unique_lock lock(mu_);
  registry_ = nullptr;
}

}  // namespace zo
