// The TCP transport's wire format (tcp_transport.h), apart from the sockets
// so tests can write a misbehaving peer. All integers little-endian.
//
// Handshake, each side sends one right after connecting, then reads the
// other's (32 bytes + job + host + sharing + link):
//   u32 magic "ZOPH" | u32 version | u32 stages | u32 stage | u32 job bytes |
//   job | u32 host bytes | host | u32 sharing bytes | sharing | u32 link bytes | link
// host names the machine (its boot id). sharing, when not empty, says the
// stage can share its backend's memory (backend DeviceSharing; the backend's
// name); link, that it can join a device link (backend DeviceLinks; the
// backend's name, then ";prefer" when it wants one even on this host).
// Then, between two stages that chose one:
//   - inboxes (same host, both share, no link): each sends a field with its
//     inbox's handle (empty: none could be had), then one byte: 1 when it
//     mapped the peer's. An inbox its peer did not map is freed.
//   - a device link (both can; other hosts, or one prefers it): the lower
//     stage sends a field with the link's offer (NCCL ids) and both join it.
// A field is u32 bytes | bytes (EncodeField).
// Message frame (96-byte header + payload):
//   u32 magic "ZOPM" | u8 kind | u8 dtype | u8 rank | u8 where | i64 step |
//   i32 micro_batch | i32 chunk | 8 x i64 dims (unused = 0) | u64 payload bytes
//   where = 0: the payload follows, the tensor in its storage dtype (backend
//   Download/Upload bytes); where = s + 1 (s < kMaxInboxSlots): the tensor
//   is in the receiver's inbox slot s and nothing follows; where = 255
//   (kOnLink): the tensor comes over the device link, nothing follows.
// Credit frame (kind 2, same 96 bytes): the receiver has taken inbox slot
// `where - 1`; every other field is 0.
#ifndef ZO_WORKER_PIPELINE_INTERNAL_TCP_WIRE_H_
#define ZO_WORKER_PIPELINE_INTERNAL_TCP_WIRE_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/dtype.h"
#include "worker/backend/tensor.h"
#include "worker/pipeline/transport.h"

namespace zo::pipeline::pipeline_internal {

inline constexpr uint32_t kHelloMagic = 0x48504f5a;  // "ZOPH"
inline constexpr uint32_t kFrameMagic = 0x4d504f5a;  // "ZOPM"
inline constexpr uint32_t kProtocolVersion = 2;
inline constexpr size_t kHelloFixedBytes = 20;
inline constexpr size_t kMaxJobBytes = 4096;
// Bounds on the host and inbox fields.
inline constexpr size_t kMaxHelloFieldBytes = 4096;
// Slots are numbered in one byte (where - 1); its last value means the link.
inline constexpr int kMaxInboxSlots = 254;
inline constexpr int kOnLink = 254;  // FrameHeader::slot of a tensor on the device link
inline constexpr size_t kFrameHeaderBytes = 96;
inline constexpr int kMaxRank = 8;

struct Hello {
  uint32_t magic = kHelloMagic;
  uint32_t version = kProtocolVersion;
  uint32_t stages = 0;
  uint32_t stage = 0;
  std::string job;
  std::string host;
  std::string sharing;
  std::string link;
};

// The whole handshake message.
std::string EncodeHello(const Hello& hello);
// One length-prefixed field (u32 bytes | bytes), as the handshake's host,
// sharing and link fields and the inbox handles and link offer after it.
std::string EncodeField(const std::string& bytes);
// The fixed part; `job` is left empty and its length returned in *job_bytes.
Hello DecodeHelloFixed(const std::byte* bytes, uint32_t* job_bytes);
// A little-endian u32: the lengths of the host and inbox fields.
uint32_t DecodeU32(const std::byte* bytes);

struct FrameHeader {
  MessageTag tag;
  DType dtype = DType::kFloat32;
  backend::Shape shape;
  uint64_t payload_bytes = 0;
  // >= 0: the tensor is in this slot of the receiver's inbox, or on the
  // device link when kOnLink; no payload follows (payload_bytes still says
  // its size).
  int slot = -1;
  // A credit: the receiver has taken `slot`; the other fields are unused.
  bool credit = false;
};

// The credit frame returning `slot`.
inline FrameHeader Credit(int slot) {
  FrameHeader h;
  h.slot = slot;
  h.credit = true;
  return h;
}

void EncodeFrameHeader(const FrameHeader& header, std::byte* out);
// DATA_LOSS naming what is wrong: magic, kind, dtype, rank > kMaxRank, a
// negative dimension, payload != numel x dtype size, payload >
// max_message_bytes, a credit without a slot.
absl::StatusOr<FrameHeader> DecodeFrameHeader(absl::Span<const std::byte> bytes,
                                              int64_t max_message_bytes);

}  // namespace zo::pipeline::pipeline_internal

#endif  // ZO_WORKER_PIPELINE_INTERNAL_TCP_WIRE_H_
