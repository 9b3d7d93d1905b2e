// The same-host route's credits (worker_region.h): every micro-batch's
// gradient of an element has the same place in its step's gradient area, so
// a piece may be written there only once the server has summed the piece
// that wrote those bytes before it in the step. The server says so by
// storing the piece's sequence number into the area's acknowledgement slot
// (GradientPiece.region_ack) after summing it. It sums a call's pieces in
// the order they were sent, and a step's pieces to one server go on one
// call, so a slot at n says every piece numbered up to n is summed.
//
// RegionCredits remembers, per area, which piece last wrote which bytes;
// AwaitRegionAck waits for the slot. A waiter that only needs pieces of an
// earlier micro-batch rarely waits: the server sums them while the worker
// computes the next one.
#ifndef ZO_WORKER_CLIENT_INTERNAL_REGION_CREDITS_H_
#define ZO_WORKER_CLIENT_INTERNAL_REGION_CREDITS_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "worker/client/internal/push_call.h"

namespace zo::client_internal {

// One server's region. Not thread-safe: the client calls it under its lock.
class RegionCredits {
 public:
  // A piece that wrote an area: its sequence number and the call it went on.
  struct Writer {
    uint32_t seq = 0;
    std::shared_ptr<PushCall> call;
  };
  // Piece `a` was sent after piece `b` (sequence numbers wrap).
  static bool SentAfter(uint32_t a, uint32_t b) { return static_cast<int32_t>(a - b) > 0; }
  // The piece sent last of those that wrote bytes [begin, end) (region
  // offsets) of `step`'s area during `step`; none when no piece did.
  std::optional<Writer> LastWriter(int64_t step, int64_t begin, int64_t end) const;
  // Bytes [begin, end) of `step`'s area now hold a piece sent on `call`:
  // its sequence number, which it carries as region_ack. Numbers grow per
  // area across steps (the slot is never reset), wrapping at 2^32.
  uint32_t Wrote(int64_t step, int64_t begin, int64_t end, std::shared_ptr<PushCall> call);

 private:
  struct Written {
    int64_t end;
    Writer writer;
  };
  struct Area {
    int64_t step = -1;  // whose pieces `written` holds
    uint32_t next_seq = 1;
    std::map<int64_t, Written> written;  // by first byte; disjoint
  };
  Area areas_[2];  // by step % 2, as the region's gradient areas
};

// Waits until `slot` (the area's acknowledgement, then the count of this
// process's threads waiting on it) acknowledges `writer`'s piece, or until
// `writer`'s call has ended (the server reads none of its pieces after
// that). DEADLINE_EXCEEDED naming `server` when `deadline` comes first.
absl::Status AwaitRegionAck(uint32_t* slot, const RegionCredits::Writer& writer,
                            absl::Time deadline, const std::string& server);

}  // namespace zo::client_internal

#endif  // ZO_WORKER_CLIENT_INTERNAL_REGION_CREDITS_H_
