#include "worker/client/internal/pull_receiver.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "common/stream_copy.h"
#include "rpc/proto_convert.h"

namespace zo::client_internal {

PullReceiver::PullReceiver(const ShardMap& map, DType dtype, int server, int64_t version,
                           int64_t have_version, absl::Span<const int> tensors,
                           absl::Span<const absl::Span<std::byte>> dst, PullStripe stripe)
    : map_(map), dtype_(dtype), version_(version), have_version_(have_version) {
  for (size_t i = 0; i < tensors.size(); ++i) {
    Slot slot;
    slot.tensor = tensors[i];
    slot.dst = dst[i];
    for (const TensorPiece& p : map.PiecesOfTensor(tensors[i])) {
      if (p.server != server) continue;
      if (map.StripeOfChunk(p.chunk, stripe.stripes) != stripe.stripe) continue;
      const int64_t begin = p.tensor_offset;
      const int64_t end = p.tensor_offset + p.length;
      if (!slot.owned.empty() && slot.owned.back().second == begin) {
        slot.owned.back().second = end;
      } else {
        slot.owned.emplace_back(begin, end);
      }
      slot.owned_elems += p.length;
    }
    if (slot.owned_elems > 0) slots_.push_back(std::move(slot));
  }
  std::sort(slots_.begin(), slots_.end(),
            [](const Slot& a, const Slot& b) { return a.tensor < b.tensor; });
  for (const Slot& slot : slots_) tensor_ids_.push_back(slot.tensor);
}

std::string PullReceiver::TensorLabel(int t) const {
  return absl::StrCat("tensor #", t, " '", map_.tensors()[t].name, "'");
}

void PullReceiver::Reset() {
  for (Slot& slot : slots_) slot.received.clear();
  unchanged_ = false;
  pieces_ = 0;
  loss_scale_ = 0;
}

absl::Status PullReceiver::SetLossScale(double loss_scale) {
  if (!std::isfinite(loss_scale) || loss_scale <= 0) {
    return absl::InternalError(
        absl::StrCat("sent loss scale ", loss_scale, " with version ", version_));
  }
  loss_scale_ = loss_scale;
  return absl::OkStatus();
}

absl::Status PullReceiver::AcceptUnchanged(double loss_scale) {
  if (unchanged_) {
    return absl::InternalError("sent more pieces after saying the weights are unchanged");
  }
  if (have_version_ < 0) {
    return absl::InternalError(
        absl::StrCat("said version ", version_, " is unchanged, but the client holds none"));
  }
  if (pieces_ > 0) {
    return absl::InternalError("said the weights are unchanged after sending some of them");
  }
  ZO_RETURN_IF_ERROR(SetLossScale(loss_scale));
  unchanged_ = true;
  return absl::OkStatus();
}

absl::Status PullReceiver::Accept(const v1::ParamPiece& piece) {
  if (piece.region_bytes() != 0) {
    return absl::InternalError("sent a piece in a shared region to a pull that gave none");
  }
  return AcceptBytes(
      piece, {reinterpret_cast<const std::byte*>(piece.data().data()), piece.data().size()});
}

absl::Status PullReceiver::AcceptFromRegion(const v1::ParamPiece& piece,
                                            absl::Span<const std::byte> area, int64_t area_offset) {
  if (piece.more_ranges_size() == 0) return AcceptOneFromRegion(piece, area, area_offset);
  if (piece.unchanged()) {
    return absl::InternalError("sent more ranges on a piece that says the weights are unchanged");
  }
  v1::ParamPiece one = piece;
  one.clear_more_ranges();
  ZO_RETURN_IF_ERROR(AcceptOneFromRegion(one, area, area_offset));
  for (const v1::ParamRange& r : piece.more_ranges()) {
    one.set_tensor(r.tensor());
    one.set_offset(r.offset());
    one.set_region_offset(r.region_offset());
    one.set_region_bytes(r.region_bytes());
    ZO_RETURN_IF_ERROR(AcceptOneFromRegion(one, area, area_offset));
  }
  return absl::OkStatus();
}

absl::Status PullReceiver::AcceptOneFromRegion(const v1::ParamPiece& piece,
                                               absl::Span<const std::byte> area,
                                               int64_t area_offset) {
  if (piece.region_bytes() == 0) return Accept(piece);  // an unchanged pull's one piece
  if (!piece.data().empty()) {
    return absl::InternalError("sent a piece with data and a range of the shared region");
  }
  // As lengths, so that no sum can overflow.
  const int64_t at = piece.region_offset() - area_offset;
  const auto size = static_cast<int64_t>(area.size());
  if (piece.region_offset() < area_offset || piece.region_bytes() < 0 || at > size ||
      piece.region_bytes() > size - at) {
    return absl::InternalError(absl::StrCat("named bytes [", piece.region_offset(), ", +",
                                            piece.region_bytes(),
                                            ") outside the shared region's weights area"));
  }
  return AcceptBytes(
      piece, area.subspan(static_cast<size_t>(at), static_cast<size_t>(piece.region_bytes())));
}

absl::Status PullReceiver::AcceptBytes(const v1::ParamPiece& piece,
                                       absl::Span<const std::byte> data) {
  if (piece.version() != version_) {
    return absl::InternalError(absl::StrCat("sent a piece of version ", piece.version(),
                                            " for a pull of version ", version_));
  }
  if (piece.unchanged()) {
    if (!data.empty()) {
      return absl::InternalError("sent data on a piece that says the weights are unchanged");
    }
    return AcceptUnchanged(piece.loss_scale());
  }
  if (!std::isfinite(piece.loss_scale()) || piece.loss_scale() <= 0) {
    return absl::InternalError(
        absl::StrCat("sent loss scale ", piece.loss_scale(), " with version ", version_));
  }
  if (!unchanged_ && !TensorAsked(piece.tensor())) {
    return absl::InternalError(
        absl::StrCat("sent a piece of tensor #", piece.tensor(), ", which was not asked of it"));
  }
  if (absl::StatusOr<DType> d = DTypeFromProto(piece.dtype()); !d.ok() || *d != dtype_) {
    return absl::InternalError(absl::StrCat("sent ", TensorLabel(piece.tensor()), " as ",
                                            v1::DType_Name(piece.dtype()), ", the job's dtype is ",
                                            std::string(DTypeName(dtype_))));
  }
  const int64_t elem_bytes = static_cast<int64_t>(DTypeSize(dtype_));
  const int64_t bytes = static_cast<int64_t>(data.size());
  if (bytes == 0 || bytes % elem_bytes != 0) {
    return absl::InternalError(absl::StrCat("sent a piece of ", TensorLabel(piece.tensor()),
                                            " with ", bytes, " bytes, not a positive multiple of ",
                                            elem_bytes));
  }
  ZO_ASSIGN_OR_RETURN(std::byte * dst, Place(piece.tensor(), piece.offset(), bytes / elem_bytes));
  if (dst != data.data()) {
    // A large piece bypasses the cache: one core copies at about twice the
    // rate, and the weights are read next by the forward or a device copy,
    // not by this core now.
    if (static_cast<size_t>(bytes) >= kStreamCopyMinBytes) {
      StreamCopy(data.data(), dst, static_cast<size_t>(bytes));
    } else {
      std::memcpy(dst, data.data(), static_cast<size_t>(bytes));
    }
  }
  loss_scale_ = piece.loss_scale();
  return absl::OkStatus();
}

absl::Span<std::byte> PullReceiver::dst(int tensor) const {
  auto slot = std::lower_bound(slots_.begin(), slots_.end(), tensor,
                               [](const Slot& s, int t) { return s.tensor < t; });
  return slot != slots_.end() && slot->tensor == tensor ? slot->dst : absl::Span<std::byte>();
}

bool PullReceiver::TensorAsked(int tensor) const {
  auto slot = std::lower_bound(slots_.begin(), slots_.end(), tensor,
                               [](const Slot& s, int t) { return s.tensor < t; });
  return slot != slots_.end() && slot->tensor == tensor;
}

absl::StatusOr<std::byte*> PullReceiver::Place(int tensor, int64_t begin, int64_t elems) {
  if (unchanged_) {
    return absl::InternalError("sent more pieces after saying the weights are unchanged");
  }
  auto slot = std::lower_bound(slots_.begin(), slots_.end(), tensor,
                               [](const Slot& s, int t) { return s.tensor < t; });
  if (slot == slots_.end() || slot->tensor != tensor) {
    return absl::InternalError(
        absl::StrCat("sent a piece of tensor #", tensor, ", which was not asked of it"));
  }
  if (elems <= 0) {
    return absl::InternalError(absl::StrCat("sent an empty piece of ", TensorLabel(tensor)));
  }
  // The run must lie inside one run the server owns (which lies inside the
  // tensor). Owned runs are ascending: the candidate is the last that
  // begins at or before `begin`. Compared as a length, so a huge offset
  // cannot overflow.
  auto run =
      std::upper_bound(slot->owned.begin(), slot->owned.end(), begin,
                       [](int64_t b, const std::pair<int64_t, int64_t>& r) { return b < r.first; });
  if (begin < 0 || run == slot->owned.begin() || elems > std::prev(run)->second - begin) {
    return absl::InternalError(absl::StrCat("sent ", elems, " elements at offset ", begin, " of ",
                                            TensorLabel(tensor),
                                            ", which are not all among the ones it owns"));
  }
  slot->received.emplace_back(begin, begin + elems);
  ++pieces_;
  return slot->dst.data() + begin * static_cast<int64_t>(DTypeSize(dtype_));
}

absl::Status PullReceiver::Finish() const {
  if (unchanged_) return absl::OkStatus();
  for (const Slot& slot : slots_) {
    std::vector<std::pair<int64_t, int64_t>> runs = slot.received;
    std::sort(runs.begin(), runs.end());
    int64_t elems = 0;
    for (size_t i = 0; i < runs.size(); ++i) {
      if (i > 0 && runs[i].first < runs[i - 1].second) {
        return absl::DataLossError(absl::StrCat("sent elements [", runs[i].first, ", ",
                                                std::min(runs[i].second, runs[i - 1].second),
                                                ") of ", TensorLabel(slot.tensor), " twice"));
      }
      elems += runs[i].second - runs[i].first;
    }
    if (elems != slot.owned_elems) {
      return absl::DataLossError(absl::StrCat("sent ", elems, " of the ", slot.owned_elems,
                                              " elements of ", TensorLabel(slot.tensor),
                                              " it owns, for version ", version_));
    }
  }
  return absl::OkStatus();
}

}  // namespace zo::client_internal
