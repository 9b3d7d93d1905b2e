// Checks and places the ParamPieces one server sends for one Pull (or one
// stripe of its chunks, pulled on one of several connections). A server
// is trusted with nothing: every piece must lie inside the part of a
// requested tensor that the ShardMap gives that server, in the job's dtype
// and the version asked for, before a byte is copied into the caller's
// buffers; at the end every element the server owns must have arrived
// exactly once.
#ifndef ZO_WORKER_CLIENT_INTERNAL_PULL_RECEIVER_H_
#define ZO_WORKER_CLIENT_INTERNAL_PULL_RECEIVER_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/dtype.h"
#include "common/sharding.h"
#include "proto/zo/v1/params.pb.h"

namespace zo::client_internal {

// The chunks a pull asks for (PullParamsRequest.stripe/stripes): those
// whose index among the server's own, k, has k % stripes == stripe.
struct PullStripe {
  int stripe = 0;
  int stripes = 1;
};

// Not thread-safe: one per server and Pull, used by one thread. Receivers of
// different servers write disjoint bytes of the same buffers.
class PullReceiver {
 public:
  // `dst[i]` is the whole of tensor `tensors[i]` (validated by the caller);
  // `map`, `tensors` and `dst` must outlive the receiver. `have_version` is
  // -1 when the caller holds no version.
  PullReceiver(const ShardMap& map, DType dtype, int server, int64_t version, int64_t have_version,
               absl::Span<const int> tensors, absl::Span<const absl::Span<std::byte>> dst,
               PullStripe stripe = {});

  // The requested tensors this server owns a part of, ascending: what to ask
  // it for. Empty: the server has nothing to send.
  const std::vector<int>& tensors() const { return tensor_ids_; }

  // Forgets what arrived, for a retried call (the retry rewrites it).
  void Reset();
  // INTERNAL, naming what is wrong, for a piece that was not asked of this
  // server; nothing is copied then.
  absl::Status Accept(const v1::ParamPiece& piece);
  // The same for a pull into the caller's shared region: the piece's bytes
  // are region bytes [region_offset, +region_bytes), which must lie in
  // `area` (the weights area, at `area_offset` in the region). Nothing is
  // copied when they are where the caller's buffer puts them already
  // (OffloadClient::RegionPullBuffers). Each of the piece's more_ranges is
  // a piece of its own, checked the same way.
  absl::Status AcceptFromRegion(const v1::ParamPiece& piece, absl::Span<const std::byte> area,
                                int64_t area_offset);
  // The in-process route's two halves of the same checks: the server says
  // the weights are unchanged, or where elements [offset, offset + elems)
  // of `tensor` go (the server writes them there; the range counts as
  // received). INTERNAL as Accept's.
  absl::Status AcceptUnchanged(double loss_scale);
  absl::StatusOr<std::byte*> Place(int tensor, int64_t offset, int64_t elems);
  // The loss scale the in-process route answered with.
  absl::Status SetLossScale(double loss_scale);
  // DATA_LOSS unless every element this server owns of the requested
  // tensors arrived exactly once, or the server said `unchanged`.
  absl::Status Finish() const;

  bool unchanged() const { return unchanged_; }
  // Where tensor `tensor` (one of tensors()) is pulled to.
  absl::Span<std::byte> dst(int tensor) const;
  // The loss scale the pieces carried; 0 before the first.
  double loss_scale() const { return loss_scale_; }

 private:
  // AcceptFromRegion of a piece without more_ranges.
  absl::Status AcceptOneFromRegion(const v1::ParamPiece& piece, absl::Span<const std::byte> area,
                                   int64_t area_offset);
  // One requested tensor as this server sees it.
  struct Slot {
    int tensor = 0;
    absl::Span<std::byte> dst;
    // Maximal runs [begin, end) of the tensor's elements the server owns,
    // ascending (adjacent chunks of one server merge when S == 1).
    std::vector<std::pair<int64_t, int64_t>> owned;
    int64_t owned_elems = 0;
    std::vector<std::pair<int64_t, int64_t>> received;  // runs, in arrival order
  };

  // Accept's checks and copy, the piece's bytes being `data`.
  absl::Status AcceptBytes(const v1::ParamPiece& piece, absl::Span<const std::byte> data);
  // Whether `tensor` is one this server was asked for.
  bool TensorAsked(int tensor) const;
  // "tensor #3 'blocks.0.w'"; `t` must be a manifest index.
  std::string TensorLabel(int t) const;

  const ShardMap& map_;
  const DType dtype_;
  const int64_t version_;
  const int64_t have_version_;
  std::vector<Slot> slots_;      // ascending by tensor
  std::vector<int> tensor_ids_;  // slots_[i].tensor
  bool unchanged_ = false;
  int64_t pieces_ = 0;
  double loss_scale_ = 0;
};

}  // namespace zo::client_internal

#endif  // ZO_WORKER_CLIENT_INTERNAL_PULL_RECEIVER_H_
