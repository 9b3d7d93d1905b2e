#include "server/gradient_piece_view.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "common/stream_copy.h"
#include "offload/optimizer_kernels.h"

namespace zo {
namespace {

// Reads the wire format across the slices of one message.
class SliceReader {
 public:
  explicit SliceReader(const std::vector<grpc::Slice>& slices) : slices_(slices) { Skip0(); }

  bool done() const { return slice_ == slices_.size(); }

  bool ReadByte(uint8_t* b) {
    if (done()) return false;
    *b = slices_[slice_].begin()[pos_];
    Advance(1);
    return true;
  }

  // Bytes read so far.
  size_t consumed() const { return consumed_; }

  bool ReadVarint(uint64_t* v) {
    *v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      uint8_t b;
      if (!ReadByte(&b)) return false;
      *v |= static_cast<uint64_t>(b & 0x7f) << shift;
      if ((b & 0x80) == 0) return true;
    }
    return false;
  }

  // The next `len` bytes as spans into the slices.
  bool ReadSpans(uint64_t len, std::vector<absl::Span<const char>>* out) {
    while (len > 0) {
      if (done()) return false;
      const grpc::Slice& s = slices_[slice_];
      const size_t take = std::min<uint64_t>(len, s.size() - pos_);
      if (out != nullptr) {
        out->emplace_back(reinterpret_cast<const char*>(s.begin()) + pos_, take);
      }
      Advance(take);
      len -= take;
    }
    return true;
  }

 private:
  void Advance(size_t n) {
    pos_ += n;
    consumed_ += n;
    Skip0();
  }
  // Moves past exhausted (or empty) slices.
  void Skip0() {
    while (slice_ < slices_.size() && pos_ == slices_[slice_].size()) {
      ++slice_;
      pos_ = 0;
    }
  }

  const std::vector<grpc::Slice>& slices_;
  size_t slice_ = 0;
  size_t pos_ = 0;
  size_t consumed_ = 0;
};

absl::Status Malformed(const char* what) {
  return absl::InvalidArgumentError(absl::StrCat("malformed GradientPiece: ", what));
}

// A RegionRange message of `len` bytes: varint fields only.
absl::Status ParseRegionRange(SliceReader& in, uint64_t len, RegionRangeView* range) {
  const size_t end = in.consumed() + len;
  while (in.consumed() < end) {
    uint64_t tag;
    uint64_t v;
    if (!in.ReadVarint(&tag)) return Malformed("truncated more_ranges tag");
    if ((tag & 7) != 0) return Malformed("more_ranges holds a field that is not a varint");
    if (!in.ReadVarint(&v)) return Malformed("truncated more_ranges varint");
    switch (tag >> 3) {
      case v1::RegionRange::kChunkFieldNumber:
        range->chunk = static_cast<int64_t>(v);
        break;
      case v1::RegionRange::kOffsetFieldNumber:
        range->offset = static_cast<int64_t>(v);
        break;
      case v1::RegionRange::kRegionOffsetFieldNumber:
        range->region_offset = static_cast<int64_t>(v);
        break;
      case v1::RegionRange::kRegionBytesFieldNumber:
        range->region_bytes = static_cast<int64_t>(v);
        break;
      case v1::RegionRange::kRegionAckOffsetFieldNumber:
        range->region_ack_offset = static_cast<int64_t>(v);
        break;
      case v1::RegionRange::kRegionAckFieldNumber:
        range->region_ack = static_cast<uint32_t>(v);
        break;
      default:
        break;  // unknown: ignored, as protobuf would
    }
  }
  if (in.consumed() != end) return Malformed("a more_ranges entry overruns its length");
  return absl::OkStatus();
}

}  // namespace

absl::Status ParseGradientPiece(const grpc::ByteBuffer& buffer, std::vector<grpc::Slice>* slices,
                                GradientPieceView* view) {
  slices->clear();
  if (!buffer.Dump(slices).ok()) return Malformed("unreadable buffer");
  *view = GradientPieceView{};
  SliceReader in(*slices);
  while (!in.done()) {
    uint64_t tag;
    if (!in.ReadVarint(&tag)) return Malformed("truncated tag");
    const uint64_t field = tag >> 3;
    switch (tag & 7) {
      case 0: {  // varint
        uint64_t v;
        if (!in.ReadVarint(&v)) return Malformed("truncated varint");
        switch (field) {
          case v1::GradientPiece::kStepFieldNumber:
            view->step = static_cast<int64_t>(v);
            break;
          case v1::GradientPiece::kDpRankFieldNumber:
            view->dp_rank = static_cast<int32_t>(v);
            break;
          case v1::GradientPiece::kChunkFieldNumber:
            view->chunk = static_cast<int64_t>(v);
            break;
          case v1::GradientPiece::kOffsetFieldNumber:
            view->offset = static_cast<int64_t>(v);
            break;
          case v1::GradientPiece::kDtypeFieldNumber:
            view->dtype = static_cast<v1::DType>(static_cast<int32_t>(v));
            break;
          case v1::GradientPiece::kResendFieldNumber:
            view->resend = v != 0;
            break;
          case v1::GradientPiece::kMicroBatchFieldNumber:
            view->micro_batch = static_cast<int32_t>(v);
            break;
          case v1::GradientPiece::kRegionOffsetFieldNumber:
            view->region_offset = static_cast<int64_t>(v);
            break;
          case v1::GradientPiece::kRegionBytesFieldNumber:
            view->region_bytes = static_cast<int64_t>(v);
            break;
          case v1::GradientPiece::kRegionAckOffsetFieldNumber:
            view->region_ack_offset = static_cast<int64_t>(v);
            break;
          case v1::GradientPiece::kRegionAckFieldNumber:
            view->region_ack = static_cast<uint32_t>(v);
            break;
          case v1::GradientPiece::kRegionLentFieldNumber:
            view->region_lent = v != 0;
            break;
          default:
            break;  // unknown: ignored, as protobuf would
        }
        break;
      }
      case 2: {  // length-delimited
        uint64_t len;
        if (!in.ReadVarint(&len)) return Malformed("truncated length");
        if (field == v1::GradientPiece::kJobFieldNumber) {
          std::vector<absl::Span<const char>> parts;
          if (len > 1024 || !in.ReadSpans(len, &parts)) return Malformed("bad job name");
          view->job.clear();
          for (const auto& p : parts) view->job.append(p.data(), p.size());
        } else if (field == v1::GradientPiece::kDataFieldNumber) {
          view->data.clear();  // a repeated field: the last one wins, as in protobuf
          if (!in.ReadSpans(len, &view->data)) return Malformed("truncated data");
          view->data_bytes = static_cast<size_t>(len);
        } else if (field == v1::GradientPiece::kMoreRangesFieldNumber) {
          if (view->more_ranges.size() >= kMaxMoreRanges) return Malformed("too many more_ranges");
          ZO_RETURN_IF_ERROR(ParseRegionRange(in, len, &view->more_ranges.emplace_back()));
        } else if (!in.ReadSpans(len, nullptr)) {
          return Malformed("truncated field");
        }
        break;
      }
      case 1: {  // fixed64, little-endian
        std::vector<absl::Span<const char>> parts;
        if (!in.ReadSpans(8, &parts)) return Malformed("truncated fixed64");
        if (field == v1::GradientPiece::kIncarnationFieldNumber ||
            field == v1::GradientPiece::kRegionFieldNumber) {
          char bytes[8];
          size_t at = 0;
          for (const auto& p : parts) {
            std::memcpy(bytes + at, p.data(), p.size());
            at += p.size();
          }
          uint64_t v = 0;
          for (int b = 7; b >= 0; --b) v = (v << 8) | static_cast<unsigned char>(bytes[b]);
          (field == v1::GradientPiece::kRegionFieldNumber ? view->region : view->incarnation) = v;
        }
        break;
      }
      case 5:
        if (!in.ReadSpans(4, nullptr)) return Malformed("truncated fixed32");
        break;
      default:
        return Malformed("unknown wire type");
    }
  }
  return absl::OkStatus();
}

GradientPieceView ViewOf(const v1::GradientPiece& piece) {
  GradientPieceView view;
  view.job = piece.job();
  view.step = piece.step();
  view.dp_rank = piece.dp_rank();
  view.chunk = piece.chunk();
  view.offset = piece.offset();
  view.dtype = piece.dtype();
  view.resend = piece.resend();
  view.incarnation = piece.incarnation();
  view.micro_batch = piece.micro_batch();
  view.region = piece.region();
  view.region_offset = piece.region_offset();
  view.region_bytes = piece.region_bytes();
  view.region_ack_offset = piece.region_ack_offset();
  view.region_ack = piece.region_ack();
  view.region_lent = piece.region_lent();
  if (!piece.data().empty()) view.data.emplace_back(piece.data().data(), piece.data().size());
  view.data_bytes = piece.data().size();
  for (const v1::RegionRange& r : piece.more_ranges()) {
    view.more_ranges.push_back({.chunk = r.chunk(),
                                .offset = r.offset(),
                                .region_offset = r.region_offset(),
                                .region_bytes = r.region_bytes(),
                                .region_ack_offset = r.region_ack_offset(),
                                .region_ack = r.region_ack()});
  }
  return view;
}

GradientPieceView GradientPieceView::Range(size_t k) const {
  const RegionRangeView& r = more_ranges[k];
  GradientPieceView piece{.job = job,
                          .step = step,
                          .dp_rank = dp_rank,
                          .chunk = r.chunk,
                          .offset = r.offset,
                          .dtype = dtype,
                          .resend = resend,
                          .incarnation = incarnation,
                          .micro_batch = micro_batch,
                          .region = region,
                          .region_offset = r.region_offset,
                          .region_bytes = r.region_bytes,
                          .region_ack_offset = r.region_ack_offset,
                          .region_ack = r.region_ack,
                          .region_lent = region_lent,
                          .data = {},
                          .data_bytes = 0,
                          .more_ranges = {}};
  return piece;
}

void AccumulateSegments(absl::Span<const absl::Span<const char>> data, DType dtype, size_t first,
                        size_t n, float* acc, bool overwrite) {
  const size_t elem = DTypeSize(dtype);
  size_t byte = first * elem;  // position in the concatenated payload
  const size_t end = (first + n) * elem;
  size_t seg = 0;
  size_t seg_begin = 0;  // payload position where data[seg] starts
  while (byte < end) {
    while (byte >= seg_begin + data[seg].size()) seg_begin += data[seg++].size();
    const size_t in_seg = byte - seg_begin;
    const size_t whole = std::min(data[seg].size() - in_seg, end - byte) / elem;
    if (whole > 0) {
      AccumulateGradient({data[seg].data() + in_seg, dtype}, acc, whole, overwrite, nullptr);
      acc += whole;
      byte += whole * elem;
      continue;
    }
    // One element split between segments: gather its bytes.
    char element[4];
    for (size_t k = 0; k < elem; ++k, ++byte) {
      while (byte >= seg_begin + data[seg].size()) seg_begin += data[seg++].size();
      element[k] = data[seg][byte - seg_begin];
    }
    AccumulateGradient({element, dtype}, acc, 1, overwrite, nullptr);
    ++acc;
  }
}

void CopySegments(absl::Span<const absl::Span<const char>> data, size_t first, size_t n,
                  char* dst) {
  size_t seg_begin = 0;  // payload position where data[seg] starts
  for (size_t seg = 0; n > 0; seg_begin += data[seg++].size()) {
    if (first >= seg_begin + data[seg].size()) continue;
    const size_t in_seg = first - seg_begin;
    const size_t take = std::min(data[seg].size() - in_seg, n);
    // A large piece bypasses the cache: one core copies at about twice the
    // rate (64 MiB in 4 MiB pieces: 3.3-3.7 ms against 6.5-7.4 with plain
    // stores, which read each destination line first), and the server
    // reads the gradient once, later, whole chunks at a time.
    if (take >= kStreamCopyMinBytes) {
      StreamCopy(data[seg].data() + in_seg, dst, take);
    } else {
      std::memcpy(dst, data[seg].data() + in_seg, take);
    }
    dst += take;
    first += take;
    n -= take;
  }
}

}  // namespace zo
