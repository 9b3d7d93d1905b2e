#include "worker/client/internal/region_credits.h"

#include <algorithm>
#include <atomic>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/shared_futex.h"

namespace zo::client_internal {
namespace {

// How long one futex sleep lasts at most: between sleeps the waiter looks
// whether the writer's call has ended, which wakes nobody.
constexpr absl::Duration kLookAgain = absl::Milliseconds(20);

}  // namespace

std::optional<RegionCredits::Writer> RegionCredits::LastWriter(int64_t step, int64_t begin,
                                                               int64_t end) const {
  const Area& area = areas_[step % 2];
  if (area.step != step || begin >= end) return std::nullopt;
  std::optional<Writer> last;
  auto it = area.written.upper_bound(begin);
  if (it != area.written.begin() && std::prev(it)->second.end > begin) --it;
  for (; it != area.written.end() && it->first < end; ++it) {
    if (!last.has_value() || RegionCredits::SentAfter(it->second.writer.seq, last->seq))
      last = it->second.writer;
  }
  return last;
}

uint32_t RegionCredits::Wrote(int64_t step, int64_t begin, int64_t end,
                              std::shared_ptr<PushCall> call) {
  Area& area = areas_[step % 2];
  if (area.step != step) {
    // The step two before's calls have all ended: nothing of it is read.
    area.written.clear();
    area.step = step;
  }
  const uint32_t seq = area.next_seq++;
  if (begin >= end) return seq;
  // Cut away what the new piece overwrites, keeping the parts around it.
  auto it = area.written.upper_bound(begin);
  if (it != area.written.begin() && std::prev(it)->second.end > begin) --it;
  while (it != area.written.end() && it->first < end) {
    const int64_t first = it->first;
    const Written old = it->second;
    it = area.written.erase(it);
    if (first < begin) area.written.emplace(first, Written{begin, old.writer});
    if (old.end > end) it = area.written.emplace(end, Written{old.end, old.writer}).first;
  }
  area.written.emplace(begin, Written{end, {seq, std::move(call)}});
  return seq;
}

absl::Status AwaitRegionAck(uint32_t* slot, const RegionCredits::Writer& writer,
                            absl::Time deadline, const std::string& server) {
  std::atomic_ref<uint32_t> ack(slot[0]);
  std::atomic_ref<uint32_t> waiters(slot[1]);
  auto summed = [&](uint32_t seen) { return !RegionCredits::SentAfter(writer.seq, seen); };
  if (summed(ack.load())) return absl::OkStatus();
  waiters.fetch_add(1);
  absl::Status status;
  for (;;) {
    // Counted before looking (both sequentially consistent, as the
    // server's store-then-look): either this sees the acknowledgement or
    // the server sees the count and wakes it.
    const uint32_t seen = ack.load();
    if (summed(seen)) break;
    if (writer.call == nullptr || writer.call->WaitFor(absl::ZeroDuration())) break;
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) {
      status = absl::DeadlineExceededError(absl::StrCat(
          "server ", server, " has not summed gradient piece ", writer.seq,
          " in the shared region, whose bytes the next micro-batch's gradient would overwrite"));
      break;
    }
    SharedFutexWait(slot, seen, std::min(left, kLookAgain));
  }
  waiters.fetch_sub(1);
  return status;
}

}  // namespace zo::client_internal
