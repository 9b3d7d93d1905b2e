#include "server/pull_cursor.h"

#include <algorithm>

#include "rpc/proto_convert.h"

namespace zo {

PullCursor PullCursor::Unchanged(int64_t version, double loss_scale) {
  PullCursor cursor(version, loss_scale);
  cursor.unchanged_ = true;
  return cursor;
}

PullCursor PullCursor::Serving(int64_t version, double loss_scale, DType dtype,
                               ParamVersions::Lease lease, std::vector<Range> ranges) {
  PullCursor cursor(version, loss_scale);
  cursor.dtype_ = dtype;
  cursor.lease_.emplace(std::move(lease));
  cursor.ranges_ = std::move(ranges);
  return cursor;
}

bool PullCursor::Next(v1::ParamPiece* piece) {
  piece->Clear();
  piece->set_version(version_);
  piece->set_loss_scale(loss_scale_);
  if (unchanged_) {
    if (unchanged_sent_) return false;
    unchanged_sent_ = true;
    piece->set_unchanged(true);
    return true;
  }
  while (range_ < ranges_.size() && done_ == ranges_[range_].elems) {
    ++range_;
    done_ = 0;
  }
  if (range_ == ranges_.size()) return false;
  const Range& r = ranges_[range_];
  const int64_t elem = static_cast<int64_t>(DTypeSize(dtype_));
  const int64_t len = std::min(kMaxPullPieceBytes / elem, r.elems - done_);
  const char* data = static_cast<const char*>(lease_->data());
  piece->set_dtype(DTypeToProto(dtype_));
  piece->set_tensor(r.tensor);
  piece->set_offset(r.tensor_offset + done_);
  piece->set_data(data + (r.local_offset + done_) * elem, static_cast<size_t>(len * elem));
  done_ += len;
  bytes_given_ += len * elem;
  return true;
}

}  // namespace zo
