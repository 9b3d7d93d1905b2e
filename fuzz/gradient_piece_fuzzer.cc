// A PushGradients message as the server receives it: the hand parser of
// GradientPiece bytes (server/gradient_piece_view.h) over the slices gRPC
// hands over, then what the job does with a piece it accepts
// (server/gradient_accumulator.h: rank, size and range checks, coverage,
// the copy or fp32 accumulation across slice boundaries).
//
// Input: byte 0 cuts the message into slices of that many bytes (0: one
// slice); byte 1 picks the accumulator (bit 0: two dp ranks) and a second,
// resent push shifted by (byte 1 >> 1) % 8 - 4 elements; the rest is the
// serialised GradientPiece.
//
// A piece that names a shared region (the same-host route) is resolved the
// way the push reactor does it: its range checked against a 4 KiB region
// (server/shared_regions.h), its data then read from there, and its
// acknowledgement slot checked, then written once the piece is summed; so
// is each of its more_ranges, every one resolved before any is pushed.
//
// Invariant: when protobuf also parses the bytes, both agree on every field.
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/wake_queue.h"
#include "fuzz/fuzz_support.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/slice.h"
#include "offload/thread_pool.h"
#include "proto/zo/v1/gradients.pb.h"
#include "rpc/proto_convert.h"
#include "server/gradient_accumulator.h"
#include "server/gradient_piece_view.h"
#include "server/shared_regions.h"

namespace {

// Two chunks of a server, as a Job lays them out: 100 and 37 elements.
constexpr int64_t kChunkElems[] = {100, 37};

zo::ThreadPool* pool = nullptr;
zo::WakeQueue* wakes = nullptr;
zo::SharedRegion* region = nullptr;  // 4 KiB of anonymous memory

std::string Concat(const zo::GradientPieceView& view) {
  std::string out;
  for (const auto& span : view.data) out.append(span.data(), span.size());
  return out;
}

void CompareWithProtobuf(const zo::GradientPieceView& view, const std::string& message) {
  zo::v1::GradientPiece piece;
  if (!piece.ParseFromString(message)) return;  // e.g. a job name that is not UTF-8
  ZO_FUZZ_CHECK(view.job == piece.job(), "job");
  ZO_FUZZ_CHECK(view.step == piece.step(), "step");
  ZO_FUZZ_CHECK(view.dp_rank == piece.dp_rank(), "dp_rank");
  ZO_FUZZ_CHECK(view.chunk == piece.chunk(), "chunk");
  ZO_FUZZ_CHECK(view.offset == piece.offset(), "offset");
  ZO_FUZZ_CHECK(view.dtype == piece.dtype(), "dtype");
  ZO_FUZZ_CHECK(view.resend == piece.resend(), "resend");
  ZO_FUZZ_CHECK(view.incarnation == piece.incarnation(), "incarnation");
  ZO_FUZZ_CHECK(view.micro_batch == piece.micro_batch(), "micro_batch");
  ZO_FUZZ_CHECK(view.region == piece.region(), "region");
  ZO_FUZZ_CHECK(view.region_offset == piece.region_offset(), "region_offset");
  ZO_FUZZ_CHECK(view.region_bytes == piece.region_bytes(), "region_bytes");
  ZO_FUZZ_CHECK(view.region_ack_offset == piece.region_ack_offset(), "region_ack_offset");
  ZO_FUZZ_CHECK(view.region_ack == piece.region_ack(), "region_ack");
  ZO_FUZZ_CHECK(view.region_lent == piece.region_lent(), "region_lent");
  ZO_FUZZ_CHECK(view.data_bytes == piece.data().size(), "data size");
  ZO_FUZZ_CHECK(Concat(view) == piece.data(), "data");
  ZO_FUZZ_CHECK(view.more_ranges.size() == static_cast<size_t>(piece.more_ranges_size()),
                "more_ranges");
  for (int k = 0; k < piece.more_ranges_size(); ++k) {
    const zo::v1::RegionRange& r = piece.more_ranges(k);
    const zo::RegionRangeView& v = view.more_ranges[static_cast<size_t>(k)];
    ZO_FUZZ_CHECK(v.chunk == r.chunk() && v.offset == r.offset() &&
                      v.region_offset == r.region_offset() && v.region_bytes == r.region_bytes() &&
                      v.region_ack_offset == r.region_ack_offset() &&
                      v.region_ack == r.region_ack(),
                  "a more_ranges entry");
  }
}

// PushReactor::ResolveRegion: points a piece naming the region at its bytes
// there and finds its acknowledgement slot; false where the reactor refuses.
bool ResolveRegion(zo::GradientPieceView& view, uint32_t** ack_slot) {
  *ack_slot = nullptr;
  if (view.region == 0) return view.region_ack_offset == 0;
  if (!view.data.empty()) return false;
  absl::StatusOr<absl::Span<std::byte>> bytes =
      region->Range(view.region_offset, view.region_bytes);
  if (!bytes.ok()) return false;
  ZO_FUZZ_CHECK(bytes->data() >= region->Range(0, 0)->data() && bytes->size() <= 4096 &&
                    bytes->data() + bytes->size() <= region->Range(0, 0)->data() + 4096,
                "a region range outside the region");
  view.data = {{reinterpret_cast<const char*>(bytes->data()), bytes->size()}};
  view.data_bytes = bytes->size();
  if (view.region_ack_offset != 0) {
    absl::StatusOr<uint32_t*> slot = region->AckSlot(view.region_ack_offset);
    if (!slot.ok()) return false;
    const auto* begin = reinterpret_cast<const uint32_t*>(region->Range(0, 0)->data());
    ZO_FUZZ_CHECK(*slot >= begin && *slot + 2 <= begin + 4096 / sizeof(uint32_t),
                  "an acknowledgement slot outside the region");
    *ack_slot = *slot;
  }
  return true;
}

// What Job::TryPushGradient does once the chunk and dtype are checked, and
// the push reactor's acknowledgement into `ack_slot` (may be null) of a
// piece it summed.
void Push(zo::GradientPieceView view, int dp, int pushes_per_rank, int shift, uint32_t* ack_slot) {
  if (view.chunk < 0 || view.chunk >= 2) return;  // Job::LocalChunkIndex
  absl::StatusOr<zo::DType> dtype = zo::DTypeFromProto(view.dtype);
  if (!dtype.ok()) return;  // Job::PushedChunkIndex
  zo::GradientAccumulator::Options options;
  options.job = "fuzz";
  options.chunks = {{0, 0, kChunkElems[0]}, {1, kChunkElems[0], kChunkElems[1]}};
  options.dp_world_size = dp;
  options.pushes_per_rank = pushes_per_rank;
  options.dtype = *dtype;
  options.pool = pool;
  options.wakes = wakes;
  absl::StatusOr<std::unique_ptr<zo::GradientAccumulator>> acc =
      zo::GradientAccumulator::Create(std::move(options));
  ZO_FUZZ_CHECK(acc.ok(), acc.status().ToString());
  const int index = static_cast<int>(view.chunk);
  for (int attempt = 0; attempt < 2; ++attempt) {
    zo::GradientAccumulator::PushWait wait;
    absl::StatusOr<zo::GradientAccumulator::PushOutcome> outcome =
        (*acc)->TryPush(index, view, &wait, [] {});
    if (outcome.ok() && *outcome == zo::GradientAccumulator::PushOutcome::kWaiting) {
      (*acc)->CancelWait(index, wait);
    }
    if (outcome.ok() && *outcome == zo::GradientAccumulator::PushOutcome::kAdded &&
        ack_slot != nullptr) {
      zo::SharedRegion::Acknowledge(ack_slot, view.region_ack);
    }
    // The same bytes again, resent from a shifted offset: overlaps and gaps.
    view.resend = true;
    if (__builtin_add_overflow(view.offset, shift, &view.offset)) return;
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  zo::fuzz::QuietLogs();
  pool = new zo::ThreadPool(1);  // runs inline
  wakes = new zo::WakeQueue();
  void* base = mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ZO_FUZZ_CHECK(base != MAP_FAILED, "mmap");
  region = new zo::SharedRegion("fuzz", getpid(), static_cast<std::byte*>(base), 4096);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const size_t cut = data[0];
  const int dp = 1 + (data[1] & 1);
  const int shift = (data[1] >> 1) % 8 - 4;
  const int pushes_per_rank = 1 + (data[1] >> 4) % 3;  // micro-batches pushed one by one
  const std::string message(reinterpret_cast<const char*>(data + 2), size - 2);

  std::vector<grpc::Slice> in;
  for (size_t at = 0; at < message.size() || in.empty();) {
    const size_t n = cut == 0 ? message.size() - at : std::min(cut, message.size() - at);
    in.emplace_back(message.data() + at, n);
    at += n;
    if (n == 0) break;
  }
  const grpc::ByteBuffer buffer(in.data(), in.size());

  std::vector<grpc::Slice> slices;
  zo::GradientPieceView view;
  if (!zo::ParseGradientPiece(buffer, &slices, &view).ok()) return 0;
  CompareWithProtobuf(view, message);
  // PushReactor::ResolvePieces: the message's piece and its more_ranges,
  // every one resolved before any is pushed.
  if (view.region == 0 && !view.more_ranges.empty()) return 0;
  std::vector<zo::GradientPieceView> pieces;
  for (size_t k = 0; k < view.more_ranges.size(); ++k) pieces.push_back(view.Range(k));
  pieces.insert(pieces.begin(), view);
  std::vector<uint32_t*> ack_slots(pieces.size(), nullptr);
  for (size_t k = 0; k < pieces.size(); ++k) {
    if (!ResolveRegion(pieces[k], &ack_slots[k])) return 0;
  }
  for (size_t k = 0; k < pieces.size(); ++k) {
    Push(pieces[k], dp, pushes_per_rank, shift, ack_slots[k]);
  }
  return 0;
}
