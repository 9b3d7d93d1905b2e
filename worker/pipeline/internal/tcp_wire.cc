#include "worker/pipeline/internal/tcp_wire.h"

#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace zo::pipeline::pipeline_internal {
namespace {

template <typename T>
void Put(std::byte*& p, T value) {
  auto u = static_cast<std::make_unsigned_t<T>>(value);
  for (size_t i = 0; i < sizeof(T); ++i) {
    *p++ = static_cast<std::byte>(u & 0xff);
    u = static_cast<decltype(u)>(u >> 8);
  }
}

template <typename T>
T Get(const std::byte*& p) {
  std::make_unsigned_t<T> u = 0;
  for (size_t i = sizeof(T); i-- > 0;) {
    u = static_cast<decltype(u)>((u << 8) | static_cast<uint8_t>(p[i]));
  }
  p += sizeof(T);
  return static_cast<T>(u);
}

// The frame kind after kActivation (0) and kGrad (1).
constexpr uint8_t kCreditKind = 2;

}  // namespace

std::string EncodeHello(const Hello& hello) {
  std::string out(kHelloFixedBytes + hello.job.size() + 12 + hello.host.size() +
                      hello.sharing.size() + hello.link.size(),
                  '\0');
  std::byte* p = reinterpret_cast<std::byte*>(out.data());
  Put(p, hello.magic);
  Put(p, hello.version);
  Put(p, hello.stages);
  Put(p, hello.stage);
  auto field = [&p](const std::string& bytes) {
    Put(p, static_cast<uint32_t>(bytes.size()));
    std::memcpy(p, bytes.data(), bytes.size());
    p += bytes.size();
  };
  field(hello.job);
  field(hello.host);
  field(hello.sharing);
  field(hello.link);
  return out;
}

uint32_t DecodeU32(const std::byte* bytes) { return Get<uint32_t>(bytes); }

std::string EncodeField(const std::string& bytes) {
  std::string out(4 + bytes.size(), '\0');
  std::byte* p = reinterpret_cast<std::byte*>(out.data());
  Put(p, static_cast<uint32_t>(bytes.size()));
  std::memcpy(p, bytes.data(), bytes.size());
  return out;
}

Hello DecodeHelloFixed(const std::byte* bytes, uint32_t* job_bytes) {
  Hello hello;
  hello.magic = Get<uint32_t>(bytes);
  hello.version = Get<uint32_t>(bytes);
  hello.stages = Get<uint32_t>(bytes);
  hello.stage = Get<uint32_t>(bytes);
  *job_bytes = Get<uint32_t>(bytes);
  return hello;
}

void EncodeFrameHeader(const FrameHeader& header, std::byte* out) {
  std::byte* p = out;
  Put(p, kFrameMagic);
  Put(p, header.credit ? kCreditKind : static_cast<uint8_t>(header.tag.kind));
  Put(p, static_cast<uint8_t>(header.dtype));
  Put(p, static_cast<uint8_t>(header.shape.size()));
  Put(p, static_cast<uint8_t>(header.slot + 1));
  Put(p, header.tag.step);
  Put(p, static_cast<int32_t>(header.tag.micro_batch));
  Put(p, static_cast<int32_t>(header.tag.chunk));
  for (int i = 0; i < kMaxRank; ++i) {
    Put(p, i < static_cast<int>(header.shape.size()) ? header.shape[i] : int64_t{0});
  }
  Put(p, header.payload_bytes);
}

absl::StatusOr<FrameHeader> DecodeFrameHeader(absl::Span<const std::byte> bytes,
                                              int64_t max_message_bytes) {
  if (bytes.size() != kFrameHeaderBytes) {
    return absl::DataLossError(
        absl::StrCat("message header of ", bytes.size(), " bytes, expected ", kFrameHeaderBytes));
  }
  const std::byte* p = bytes.data();
  const uint32_t magic = Get<uint32_t>(p);
  if (magic != kFrameMagic) {
    return absl::DataLossError(absl::StrCat("message header with bad magic 0x", absl::Hex(magic),
                                            " (expected 0x", absl::Hex(kFrameMagic), ")"));
  }
  FrameHeader h;
  const uint8_t kind = Get<uint8_t>(p);
  const uint8_t dtype = Get<uint8_t>(p);
  const uint8_t rank = Get<uint8_t>(p);
  h.slot = static_cast<int>(Get<uint8_t>(p)) - 1;
  if (kind == kCreditKind) {
    if (h.slot < 0 || h.slot >= kMaxInboxSlots) {
      return absl::DataLossError(absl::StrCat("credit frame for slot ", h.slot));
    }
    h.credit = true;
    return h;
  }
  if (kind > static_cast<uint8_t>(MessageTag::Kind::kGrad)) {
    return absl::DataLossError(
        absl::StrCat("message header with unknown kind ", static_cast<int>(kind)));
  }
  if (dtype > static_cast<uint8_t>(DType::kBFloat16)) {
    return absl::DataLossError(
        absl::StrCat("message header with unknown dtype ", static_cast<int>(dtype)));
  }
  if (rank > kMaxRank) {
    return absl::DataLossError(
        absl::StrCat("message header with rank ", static_cast<int>(rank), " > ", kMaxRank));
  }
  h.tag.kind = static_cast<MessageTag::Kind>(kind);
  h.dtype = static_cast<DType>(dtype);
  h.tag.step = Get<int64_t>(p);
  h.tag.micro_batch = Get<int32_t>(p);
  h.tag.chunk = Get<int32_t>(p);
  // Elements, bounded by max_message_bytes so the product cannot overflow.
  // The bound is on the nonzero dimensions: past a zero the element count
  // stays 0, but whoever shapes the tensor multiplies the others.
  const int64_t limit = max_message_bytes / static_cast<int64_t>(DTypeSize(h.dtype));
  int64_t numel = 1;
  int64_t nonzero = 1;
  for (int i = 0; i < kMaxRank; ++i) {
    const int64_t dim = Get<int64_t>(p);
    if (i >= rank) continue;
    if (dim < 0) {
      return absl::DataLossError(absl::StrCat("message header with dimension ", i, " = ", dim));
    }
    h.shape.push_back(dim);
    if (dim != 0 && nonzero > limit / dim) {
      return absl::DataLossError(absl::StrCat("message of shape ", backend::ShapeString(h.shape),
                                              "... exceeds the limit of ", max_message_bytes,
                                              " bytes"));
    }
    if (dim != 0) nonzero *= dim;
    numel *= dim;
  }
  h.payload_bytes = Get<uint64_t>(p);
  const uint64_t want = static_cast<uint64_t>(numel) * DTypeSize(h.dtype);
  if (h.payload_bytes != want) {
    return absl::DataLossError(absl::StrCat("message header announces ", h.payload_bytes,
                                            " payload bytes for a ",
                                            std::string(DTypeName(h.dtype)), " tensor ",
                                            backend::ShapeString(h.shape), " of ", want, " bytes"));
  }
  return h;
}

}  // namespace zo::pipeline::pipeline_internal
