// One pull's answer, produced a piece at a time: the pieces of the requested
// tensors this server owns, cut at kMaxPullPieceBytes, read from the version
// the cursor holds (where it lies, or rounded from the master into a buffer
// of the piece's own: server/param_versions.h). A caller that writes
// asynchronously (a gRPC reactor) asks for the next piece when the last one
// is on its way; each piece's `owner` keeps its data valid.
#ifndef ZO_SERVER_PULL_CURSOR_H_
#define ZO_SERVER_PULL_CURSOR_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "common/dtype.h"
#include "proto/zo/v1/params.pb.h"
#include "rpc/in_process_route.h"
#include "server/param_versions.h"

namespace zo {

// Payload of one ParamPiece.
inline constexpr int64_t kMaxPullPieceBytes = 1 << 20;

// One piece as it leaves: a ParamPiece's fields, its data still where it
// lies in the version's memory.
struct PullPiece {
  int64_t version = 0;
  double loss_scale = 1;
  bool unchanged = false;
  int tensor = 0;
  int64_t offset = 0;  // first element, counted from the tensor's start
  DType dtype = DType::kFloat16;
  absl::Span<const std::byte> data;
  // Keeps `data` valid: what a piece written without a copy holds until the
  // transport has sent it. Null for an unchanged pull.
  std::shared_ptr<const void> owner;
};

// The piece's message with every field but `data`.
v1::ParamPiece ParamPieceHeader(const PullPiece& piece);

class PullCursor {
 public:
  // A range of one tensor and where its elements lie in the server's local
  // index space.
  struct Range {
    int tensor = 0;
    int64_t tensor_offset = 0;
    int64_t local_offset = 0;
    int64_t elems = 0;
  };

  // The pull of an unchanged version: one piece that says so.
  static PullCursor Unchanged(int64_t version, double loss_scale);
  // The ranges' data from `lease`, in order.
  static PullCursor Serving(int64_t version, double loss_scale, DType dtype,
                            ParamVersions::Lease lease, std::vector<Range> ranges);

  // The next piece; false when every piece was given, or when reading one
  // failed (then status() says why: the version was replaced under a pull
  // that outlived it).
  bool Next(PullPiece* piece);
  // The same as a message (a copy of the data).
  bool Next(v1::ParamPiece* piece);
  // The same-host route: the next piece's elements written into `area` (the
  // caller's shared region from where its local element 0 goes), at their
  // local index; `piece` gets no data and *area_offset where they went.
  // False, with status() set, when `area` is too small for them.
  bool NextInto(absl::Span<std::byte> area, PullPiece* piece, int64_t* area_offset);
  // The elements are in the caller's area already (the update wrote them
  // there: server/pull_fills.h): NextInto checks and describes each piece
  // but copies nothing.
  void SetAlreadyInArea() { already_in_area_ = true; }
  const absl::Status& status() const { return status_; }
  // The rest of the pull read straight into the caller's memory (the
  // in-process route): each range whole, once, where `place` says. The
  // first error (place's, or a version replaced under the pull) ends it.
  absl::Status ReadInto(InProcessRoute::Place place);
  // The pull of an unchanged version: ReadInto writes nothing.
  bool unchanged() const { return unchanged_; }
  double loss_scale() const { return loss_scale_; }
  // Weight bytes given so far.
  int64_t bytes_given() const { return bytes_given_; }

  PullCursor(PullCursor&&) = default;
  PullCursor& operator=(PullCursor&&) = default;

 private:
  PullCursor(int64_t version, double loss_scale) : version_(version), loss_scale_(loss_scale) {}
  // The range the next piece comes from (past those given whole); null at
  // the end.
  const Range* NextRange();

  int64_t version_;
  double loss_scale_;
  bool unchanged_ = false;
  bool unchanged_sent_ = false;
  bool already_in_area_ = false;
  DType dtype_ = DType::kFloat16;
  std::shared_ptr<ParamVersions::Lease> lease_;
  std::vector<Range> ranges_;
  size_t range_ = 0;  // the range Next reads
  int64_t done_ = 0;  // elements of ranges_[range_] already given
  int64_t bytes_given_ = 0;
  absl::Status status_;
};

}  // namespace zo

#endif  // ZO_SERVER_PULL_CURSOR_H_
