// The TCP transport's wire format (tcp_transport.h), apart from the sockets
// so tests can write a misbehaving peer. All integers little-endian.
//
// Handshake, each side sends one right after connecting, then reads the
// other's (20 bytes + job):
//   u32 magic "ZOPH" | u32 version | u32 stages | u32 stage | u32 job bytes | job
// Message frame (96-byte header + payload):
//   u32 magic "ZOPM" | u8 kind | u8 dtype | u8 rank | u8 0 | i64 step |
//   i32 micro_batch | i32 chunk | 8 x i64 dims (unused = 0) | u64 payload bytes
//   payload: the tensor in its storage dtype (backend Download/Upload bytes).
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
inline constexpr uint32_t kProtocolVersion = 1;
inline constexpr size_t kHelloFixedBytes = 20;
inline constexpr size_t kMaxJobBytes = 4096;
inline constexpr size_t kFrameHeaderBytes = 96;
inline constexpr int kMaxRank = 8;

struct Hello {
  uint32_t magic = kHelloMagic;
  uint32_t version = kProtocolVersion;
  uint32_t stages = 0;
  uint32_t stage = 0;
  std::string job;
};

// The whole handshake message.
std::string EncodeHello(const Hello& hello);
// The fixed part; `job` is left empty and its length returned in *job_bytes.
Hello DecodeHelloFixed(const std::byte* bytes, uint32_t* job_bytes);

struct FrameHeader {
  MessageTag tag;
  DType dtype = DType::kFloat32;
  backend::Shape shape;
  uint64_t payload_bytes = 0;
};

void EncodeFrameHeader(const FrameHeader& header, std::byte* out);
// DATA_LOSS naming what is wrong: magic, kind, dtype, rank > kMaxRank, a
// negative dimension, payload != numel x dtype size, payload >
// max_message_bytes.
absl::StatusOr<FrameHeader> DecodeFrameHeader(absl::Span<const std::byte> bytes,
                                              int64_t max_message_bytes);

}  // namespace zo::pipeline::pipeline_internal

#endif  // ZO_WORKER_PIPELINE_INTERNAL_TCP_WIRE_H_
