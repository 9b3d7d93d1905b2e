// What a pipeline stage reads from a neighbour's TCP connection
// (worker/pipeline/internal/tcp_wire.h): the fixed part of the handshake,
// then a message frame header, decoded against a max_message_bytes limit.
//
// Input: bytes 0-19 the handshake, 20-115 the frame header, then up to 8
// bytes of the limit (little-endian, 4 KiB to 2^40; absent: 64 MiB).
//
// Invariants: a decoded header (or credit) encodes back to one that decodes
// to the same; its payload is exactly numel x dtype size and within the limit; and
// the tensor's element count has no overflow whatever order its dimensions
// are multiplied in (the receiver allocates and shapes a tensor from them).
#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

#include "fuzz/fuzz_support.h"
#include "worker/pipeline/internal/tcp_wire.h"

namespace pi = zo::pipeline::pipeline_internal;

namespace {

void CheckHello(const uint8_t* data) {
  uint32_t job_bytes = 0;
  const pi::Hello hello =
      pi::DecodeHelloFixed(reinterpret_cast<const std::byte*>(data), &job_bytes);
  if (job_bytes > pi::kMaxJobBytes) return;  // refused by the handshake
  pi::Hello with_job = hello;
  with_job.job.assign(job_bytes, 'j');
  const std::string encoded = pi::EncodeHello(with_job);
  // The fixed part, the job, and the (empty) host, sharing and link fields' lengths.
  ZO_FUZZ_CHECK(encoded.size() == pi::kHelloFixedBytes + job_bytes + 12, "hello size");
  uint32_t again_bytes = 0;
  const pi::Hello again =
      pi::DecodeHelloFixed(reinterpret_cast<const std::byte*>(encoded.data()), &again_bytes);
  ZO_FUZZ_CHECK(again_bytes == job_bytes && again.magic == hello.magic &&
                    again.version == hello.version && again.stages == hello.stages &&
                    again.stage == hello.stage,
                "hello round trip");
}

void CheckFrame(const uint8_t* data, int64_t limit) {
  const absl::Span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data),
                                          pi::kFrameHeaderBytes);
  absl::StatusOr<pi::FrameHeader> h = pi::DecodeFrameHeader(bytes, limit);
  if (!h.ok()) return;
  std::array<std::byte, pi::kFrameHeaderBytes> encoded;
  if (h->credit) {  // names only a slot
    ZO_FUZZ_CHECK(h->slot >= 0 && h->slot < pi::kMaxInboxSlots, "credit slot");
    pi::EncodeFrameHeader(pi::Credit(h->slot), encoded.data());
    absl::StatusOr<pi::FrameHeader> again = pi::DecodeFrameHeader(encoded, limit);
    ZO_FUZZ_CHECK(again.ok() && again->credit && again->slot == h->slot, "credit round trip");
    return;
  }
  int64_t numel = 1;
  int64_t nonzero = 1;  // the product of the other dimensions, as any reshape sees it
  for (const int64_t d : h->shape) {
    ZO_FUZZ_CHECK(d >= 0, "negative dimension");
    numel *= d;
    if (d != 0) ZO_FUZZ_CHECK(!__builtin_mul_overflow(nonzero, d, &nonzero), "dimensions overflow");
  }
  ZO_FUZZ_CHECK(h->payload_bytes == static_cast<uint64_t>(numel) * zo::DTypeSize(h->dtype),
                "payload size");
  ZO_FUZZ_CHECK(h->payload_bytes <= static_cast<uint64_t>(limit), "payload over the limit");

  pi::EncodeFrameHeader(*h, encoded.data());
  absl::StatusOr<pi::FrameHeader> again = pi::DecodeFrameHeader(encoded, limit);
  ZO_FUZZ_CHECK(again.ok(), again.status().ToString());
  ZO_FUZZ_CHECK(again->tag == h->tag && again->dtype == h->dtype && again->shape == h->shape &&
                    again->payload_bytes == h->payload_bytes && again->slot == h->slot &&
                    !again->credit,
                "frame round trip");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  constexpr size_t kFrameAt = pi::kHelloFixedBytes;
  constexpr size_t kLimitAt = kFrameAt + pi::kFrameHeaderBytes;
  if (size < kLimitAt) return 0;
  CheckHello(data);
  int64_t limit = int64_t{64} << 20;
  if (size > kLimitAt) {
    uint64_t v = 0;
    for (size_t i = std::min<size_t>(size - kLimitAt, 8); i-- > 0;) v = v << 8 | data[kLimitAt + i];
    // At least 4 KiB: a configured limit below a scalar's size means nothing.
    limit = std::max<int64_t>(4096, static_cast<int64_t>(v & ((uint64_t{1} << 40) - 1)));
  }
  CheckFrame(data + kFrameAt, limit);
  return 0;
}
