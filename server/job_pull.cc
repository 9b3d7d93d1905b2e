// Job's pulls (server/job.h): a request checked, the wait for its version,
// the cursor that serves it, and the in-process and same-host routes'
// registrations that the update writes as it goes (server/pull_fills.h).
#include <algorithm>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/status_macros.h"
#include "server/job.h"

namespace zo {

absl::Status Job::CheckPullRequest(const v1::PullParamsRequest& request) const {
  ZO_RETURN_IF_ERROR(CheckIncarnation(request.incarnation()));
  for (int t : request.tensors()) {
    if (t < 0 || t >= static_cast<int>(map_.tensors().size())) {
      return absl::InvalidArgumentError(absl::StrCat("tensor index ", t, " is outside the ",
                                                     map_.tensors().size(), "-tensor manifest"));
    }
  }
  if (request.version() < 0) {
    return absl::InvalidArgumentError(absl::StrCat("version ", request.version(), " < 0"));
  }
  if (request.stripes() < 0 || request.stripes() > kMaxPullStripes || request.stripe() < 0 ||
      request.stripe() >= std::max(request.stripes(), 1)) {
    return absl::InvalidArgumentError(absl::StrCat("stripe ", request.stripe(), " of ",
                                                   request.stripes(), ": stripes are 0 to ",
                                                   kMaxPullStripes, ", a stripe below them"));
  }
  return absl::OkStatus();
}

absl::StatusOr<bool> Job::AwaitVersion(int64_t version, std::function<void()> wake,
                                       WaitList::Ticket* ticket, bool while_written) {
  return position_.AwaitVersion(version, std::move(wake), ticket, while_written);
}

bool Job::CancelVersionWait(WaitList::Ticket ticket) { return position_.CancelVersionWait(ticket); }

absl::Status Job::WaitForVersion(int64_t version, absl::Time deadline, uint64_t incarnation) {
  for (;;) {
    ZO_RETURN_IF_ERROR(CheckIncarnation(incarnation));
    auto woken = std::make_shared<absl::Notification>();
    WaitList::Ticket ticket;
    ZO_ASSIGN_OR_RETURN(const bool has, AwaitVersion(
                                            version, [woken] { woken->Notify(); }, &ticket));
    if (has) return absl::OkStatus();
    if (!woken->WaitForNotificationWithDeadline(deadline) && CancelVersionWait(ticket)) {
      const int64_t now_at = position_.version();
      return absl::DeadlineExceededError(
          absl::StrCat("version ", version, " of job ", spec_.name,
                       " did not exist before the deadline (the job is at version ", now_at,
                       ", waiting for gradients of step ", now_at + 1, ")"));
    }
  }
}

absl::Status Job::AwaitWritten(int64_t version) { return position_.AwaitWritten(version); }

absl::StatusOr<PullCursor> Job::OpenPull(const v1::PullParamsRequest& request, bool while_written) {
  ZO_RETURN_IF_ERROR(CheckPullRequest(request));
  ZO_ASSIGN_OR_RETURN(const JobPosition::Opening opening,
                      position_.OpenPull(request.version(), while_written));
  const double loss_scale = opening.loss_scale;
  if (request.have_version() >= 0) {
    const std::optional<int64_t> want = versions_->DataVersion(request.version());
    const std::optional<int64_t> have = versions_->DataVersion(request.have_version());
    if (want.has_value() && want == have)
      return PullCursor::Unchanged(request.version(), loss_scale);
  }
  absl::StatusOr<ParamVersions::Lease> lease = versions_->Acquire(request.version());
  if (!lease.ok()) {
    // A restore that began since the checks above replaced the versions.
    ZO_RETURN_IF_ERROR(CheckIncarnation(request.incarnation()));
    if (position_.RestoredSince(opening.restores_begun)) return position_.RestoredWhileOpening();
    return lease.status();
  }
  return PullCursor::Serving(request.version(), loss_scale, spec_.dtype, *std::move(lease),
                             PullRanges(request));
}

std::vector<PullCursor::Range> Job::PullRanges(const v1::PullParamsRequest& request) const {
  std::vector<int> tensors(request.tensors().begin(), request.tensors().end());
  if (tensors.empty()) {
    for (int t = 0; t < static_cast<int>(map_.tensors().size()); ++t) tensors.push_back(t);
  }
  const int stripes = std::max(request.stripes(), 1);
  std::vector<PullCursor::Range> ranges;
  for (int t : tensors) {
    for (const TensorPiece& p : map_.PiecesOfTensor(t)) {
      if (p.server != spec_.server_index) continue;
      if (map_.StripeOfChunk(p.chunk, stripes) != request.stripe()) continue;
      const int64_t local = chunks()[p.chunk / map_.num_servers()].local_offset + p.chunk_offset;
      ranges.push_back({t, p.tensor_offset, local, p.length});
    }
  }
  return ranges;
}

absl::StatusOr<PullFills::Id> Job::RegisterPull(const v1::PullParamsRequest& request,
                                                InProcessRoute::Place place) {
  ZO_RETURN_IF_ERROR(CheckPullRequest(request));
  if (!CanFill(request.version())) return 0;
  std::vector<PullFills::Copy> copies;
  for (const PullCursor::Range& r : PullRanges(request)) {
    ZO_ASSIGN_OR_RETURN(std::byte * dst, place({r.tensor, r.tensor_offset, r.elems}));
    copies.push_back({r.local_offset, r.elems, dst});
  }
  return RegisterCopies(request, std::move(copies));
}

absl::StatusOr<PullFills::Id> Job::RegisterPullInto(const v1::PullParamsRequest& request,
                                                    absl::Span<std::byte> area) {
  ZO_RETURN_IF_ERROR(CheckPullRequest(request));
  if (!CanFill(request.version())) return 0;
  const int64_t elem = static_cast<int64_t>(DTypeSize(spec_.dtype));
  std::vector<PullFills::Copy> copies;
  for (const PullCursor::Range& r : PullRanges(request)) {
    // A range the area cannot hold is left to the cursor, which says so.
    if ((r.local_offset + r.elems) * elem > static_cast<int64_t>(area.size())) return 0;
    copies.push_back({r.local_offset, r.elems, area.data() + r.local_offset * elem});
  }
  return RegisterCopies(request, std::move(copies));
}

bool Job::CanFill(int64_t version) const { return fills_ != nullptr && position_.MayFill(version); }

absl::StatusOr<PullFills::Id> Job::RegisterCopies(const v1::PullParamsRequest& request,
                                                  std::vector<PullFills::Copy> copies) {
  const int64_t version = request.version();
  const bool early = !request.tensors().empty() &&
                     request.tensors().size() < static_cast<int>(map_.tensors().size());
  // Under the position's mutex, which the update begins under too.
  return position_.RegisterFill(
      version, [&] { return fills_->Register(version, std::move(copies), nullptr, early); },
      [&] {
        return fills_->Register(
            version, std::move(copies), [&] { return versions_->DoneRanges(version); }, early);
      });
}

absl::StatusOr<std::optional<InProcessRoute::PullResult>> Job::TakeFilledPull(int64_t version,
                                                                              PullFills::Id id) {
  if (fills_ == nullptr || id == 0) return std::nullopt;
  // What the update had done when the pull registered is read here (it is
  // final), while the update fills the rest.
  std::optional<ParamVersions::Lease> lease;
  const auto read = [&](int64_t from, int64_t n, std::byte* dst) -> absl::Status {
    if (!lease.has_value()) {
      ZO_ASSIGN_OR_RETURN(ParamVersions::Lease acquired, versions_->Acquire(version));
      lease.emplace(std::move(acquired));
    }
    return lease->Read(from, n, dst);
  };
  const absl::Status done_before = fills_->ReadDoneBefore(id, read);
  std::vector<PullFills::Copy> written_ahead;
  const std::optional<int64_t> bytes = fills_->Take(id, &written_ahead);
  if (bytes.has_value() && done_before.ok()) {
    return InProcessRoute::PullResult{
        .unchanged = false, .loss_scale = position_.ScaleFor(version), .bytes = *bytes};
  }
  // Not filled: the places hold what they held before, except where a
  // dropped speculation wrote ahead. The version's own bytes go back there,
  // so that a pull that finds the version unchanged leaves true weights.
  for (const PullFills::Copy& c : written_ahead) {
    if (absl::Status s = read(c.local_offset, c.n, c.dst); !s.ok()) {
      return absl::Status(s.code(), absl::StrCat("the pull of version ", version,
                                                 " could not read back the weights a dropped "
                                                 "speculation wrote into it: ",
                                                 s.message()));
    }
  }
  return std::nullopt;
}

void Job::WithdrawPull(PullFills::Id id) {
  if (fills_ != nullptr && id != 0) fills_->Withdraw(id);
}

absl::Status Job::PullParams(const v1::PullParamsRequest& request, absl::Time deadline,
                             const std::function<bool(const v1::ParamPiece&)>& emit) {
  const absl::Time start = absl::Now();
  ZO_RETURN_IF_ERROR(CheckPullRequest(request));
  ZO_RETURN_IF_ERROR(WaitForVersion(request.version(), deadline, request.incarnation()));
  ZO_ASSIGN_OR_RETURN(PullCursor cursor, OpenPull(request));
  v1::ParamPiece piece;
  while (cursor.Next(&piece)) {
    if (!emit(piece)) return absl::CancelledError("the caller went away");
  }
  ZO_RETURN_IF_ERROR(cursor.status());
  RecordPull(absl::Now() - start, cursor.bytes_given());
  return absl::OkStatus();
}

}  // namespace zo
