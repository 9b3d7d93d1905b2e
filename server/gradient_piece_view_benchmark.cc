// Reading one pushed GradientPiece as gRPC hands it to PushGradients: a
// ByteBuffer of separately allocated slices, the header in the first. The
// view parsers (by hand, and with protobuf's CodedInputStream) leave the
// payload in the slices; protobuf's own parse, what a typed handler would do,
// copies it into the message and is the baseline they must beat.
// Bytes per second count the whole serialised piece.
//
//   build/release/bin/gradient_piece_view_benchmark --benchmark_repetitions=10
//       --benchmark_report_aggregates_only=true
#include <algorithm>
#include <climits>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "benchmark/benchmark.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream.h"
#include "google/protobuf/wire_format_lite.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/proto_buffer_reader.h"
#include "proto/zo/v1/gradients.pb.h"
#include "server/gradient_piece_view.h"

namespace zo {
namespace {

// The alternative the server does not use: the same view read with
// protobuf's CodedInputStream. Kept here as the evidence for the hand parser
// (gradient_piece_view.h).
absl::Status Malformed(const char* what) {
  return absl::InvalidArgumentError(absl::StrCat("malformed GradientPiece: ", what));
}

// One message's slices as protobuf's input stream, so that CodedInputStream
// reads the header from them in place.
class SliceInputStream final : public google::protobuf::io::ZeroCopyInputStream {
 public:
  explicit SliceInputStream(const std::vector<grpc::Slice>& slices) : slices_(slices) {}

  bool Next(const void** data, int* size) override {
    if (backed_up_ > 0) {
      *data = slices_[next_ - 1].end() - backed_up_;
      *size = backed_up_;
      backed_up_ = 0;
    } else if (next_ < slices_.size()) {
      const grpc::Slice& s = slices_[next_++];
      *data = s.begin();
      *size = static_cast<int>(s.size());
    } else {
      return false;
    }
    byte_count_ += *size;
    return true;
  }

  void BackUp(int count) override {
    backed_up_ = count;
    byte_count_ -= count;
  }

  bool Skip(int count) override {
    const void* data;
    int size;
    while (count > 0 && Next(&data, &size)) {
      if (size > count) BackUp(size - count);
      count -= std::min(size, count);
    }
    return count == 0;
  }

  int64_t ByteCount() const override { return byte_count_; }

 private:
  const std::vector<grpc::Slice>& slices_;
  size_t next_ = 0;
  int backed_up_ = 0;  // bytes at the end of slices_[next_ - 1] handed back
  int64_t byte_count_ = 0;
};

// The next `len` bytes of `in` as spans into its buffers: no copy.
bool ReadSpans(google::protobuf::io::CodedInputStream& in, uint64_t len,
               std::vector<absl::Span<const char>>* out) {
  while (len > 0) {
    const void* data;
    int size;
    if (!in.GetDirectBufferPointer(&data, &size)) return false;
    const int take = static_cast<int>(std::min<uint64_t>(len, static_cast<uint64_t>(size)));
    out->emplace_back(static_cast<const char*>(data), take);
    in.Skip(take);
    len -= take;
  }
  return true;
}

absl::Status ParseGradientPieceCoded(const grpc::ByteBuffer& buffer,
                                     std::vector<grpc::Slice>* slices, GradientPieceView* view) {
  using google::protobuf::internal::WireFormatLite;
  slices->clear();
  if (!buffer.Dump(slices).ok()) return Malformed("unreadable buffer");
  *view = GradientPieceView{};
  SliceInputStream stream(*slices);
  google::protobuf::io::CodedInputStream in(&stream);
  while (true) {
    const uint32_t tag = in.ReadTag();
    if (tag == 0) {
      if (in.ConsumedEntireMessage()) break;
      return Malformed("truncated tag or field 0");
    }
    const int field = WireFormatLite::GetTagFieldNumber(tag);
    switch (WireFormatLite::GetTagWireType(tag)) {
      case WireFormatLite::WIRETYPE_VARINT: {
        uint64_t v;
        if (!in.ReadVarint64(&v)) return Malformed("truncated varint");
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
          default:
            break;  // unknown: ignored, as protobuf would
        }
        break;
      }
      case WireFormatLite::WIRETYPE_LENGTH_DELIMITED: {
        uint64_t len;
        if (!in.ReadVarint64(&len)) return Malformed("truncated length");
        if (len > INT_MAX) return Malformed("truncated field");  // CodedInputStream counts in int
        if (field == v1::GradientPiece::kJobFieldNumber) {
          if (len > 1024 || !in.ReadString(&view->job, static_cast<int>(len))) {
            return Malformed("bad job name");
          }
        } else if (field == v1::GradientPiece::kDataFieldNumber) {
          view->data.clear();  // a repeated field: the last one wins, as in protobuf
          if (!ReadSpans(in, len, &view->data)) return Malformed("truncated data");
          view->data_bytes = static_cast<size_t>(len);
        } else if (!in.Skip(static_cast<int>(len))) {
          return Malformed("truncated field");
        }
        break;
      }
      case WireFormatLite::WIRETYPE_FIXED64:
        if (!in.Skip(8)) return Malformed("truncated fixed64");
        break;
      case WireFormatLite::WIRETYPE_FIXED32:
        if (!in.Skip(4)) return Malformed("truncated fixed32");
        break;
      default:
        return Malformed("unknown wire type");
    }
  }
  return absl::OkStatus();
}

constexpr size_t kPayloadBytes = size_t{1} << 20;  // 512 Ki fp16 elements

v1::GradientPiece Piece() {
  v1::GradientPiece piece;
  piece.set_job("gpt-7b-run-3");
  piece.set_step(123456);
  piece.set_dp_rank(5);
  piece.set_chunk(4242);
  piece.set_offset(1 << 19);
  piece.set_dtype(v1::DTYPE_BF16);
  std::string data(kPayloadBytes, '\0');
  std::mt19937 rng(1);
  for (char& c : data) c = static_cast<char>(rng());
  piece.set_data(std::move(data));
  return piece;
}

// `bytes` as slices of `slice_bytes` (the last one shorter), each its own
// allocation, as the transport fills them.
grpc::ByteBuffer Sliced(const std::string& bytes, size_t slice_bytes) {
  std::vector<grpc::Slice> slices;
  for (size_t at = 0; at < bytes.size(); at += slice_bytes) {
    slices.emplace_back(bytes.data() + at, std::min(slice_bytes, bytes.size() - at));
  }
  return grpc::ByteBuffer(slices.data(), slices.size());
}

bool SameAs(const GradientPieceView& view, const v1::GradientPiece& piece) {
  std::string data;
  for (const auto& s : view.data) data.append(s.data(), s.size());
  return view.job == piece.job() && view.step == piece.step() && view.dp_rank == piece.dp_rank() &&
         view.chunk == piece.chunk() && view.offset == piece.offset() &&
         view.dtype == piece.dtype() && view.resend == piece.resend() &&
         view.data_bytes == data.size() && data == piece.data();
}

// On a shared machine the fastest repetition is the one least disturbed.
double Min(const std::vector<double>& v) { return *std::min_element(v.begin(), v.end()); }

using Parser = absl::Status (*)(const grpc::ByteBuffer&, std::vector<grpc::Slice>*,
                                GradientPieceView*);

// As PushGradients does: the slice vector and the view reused from piece to
// piece.
void BM_View(benchmark::State& state, Parser parse) {
  const v1::GradientPiece piece = Piece();
  const std::string bytes = piece.SerializeAsString();
  const grpc::ByteBuffer buffer = Sliced(bytes, static_cast<size_t>(state.range(0)) << 10);
  std::vector<grpc::Slice> slices;
  GradientPieceView view;
  if (!parse(buffer, &slices, &view).ok() || !SameAs(view, piece)) {
    state.SkipWithError("the view differs from the piece");
    return;
  }
  for (auto _ : state) {
    benchmark::DoNotOptimize(parse(buffer, &slices, &view));
    benchmark::DoNotOptimize(view.data.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * bytes.size()));
  state.counters["slices"] = static_cast<double>(slices.size());
}
BENCHMARK_CAPTURE(BM_View, hand, &ParseGradientPiece)
    ->ComputeStatistics("min", Min)
    ->ArgName("slice_kib")
    ->Arg(8)
    ->Arg(16)
    ->Arg(64);
BENCHMARK_CAPTURE(BM_View, coded_input_stream, &ParseGradientPieceCoded)
    ->ComputeStatistics("min", Min)
    ->ArgName("slice_kib")
    ->Arg(8)
    ->Arg(16)
    ->Arg(64);

// The floor under both views: taking the slices out of the buffer.
void BM_DumpOnly(benchmark::State& state) {
  const std::string bytes = Piece().SerializeAsString();
  const grpc::ByteBuffer buffer = Sliced(bytes, static_cast<size_t>(state.range(0)) << 10);
  std::vector<grpc::Slice> slices;
  for (auto _ : state) {
    slices.clear();
    benchmark::DoNotOptimize(buffer.Dump(&slices));
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * bytes.size()));
}
BENCHMARK(BM_DumpOnly)
    ->ComputeStatistics("min", Min)
    ->ArgName("slice_kib")
    ->Arg(8)
    ->Arg(16)
    ->Arg(64);

// gRPC's default deserialiser for a typed method: protobuf reads the slices
// through ProtoBufferReader and copies the payload into the message.
void BM_ProtobufFromByteBuffer(benchmark::State& state) {
  const v1::GradientPiece piece = Piece();
  const std::string bytes = piece.SerializeAsString();
  grpc::ByteBuffer buffer = Sliced(bytes, static_cast<size_t>(state.range(0)) << 10);
  v1::GradientPiece parsed;
  for (auto _ : state) {
    grpc::ProtoBufferReader reader(&buffer);
    benchmark::DoNotOptimize(parsed.ParseFromZeroCopyStream(&reader));
    benchmark::DoNotOptimize(parsed.data().data());
  }
  if (parsed.data() != piece.data()) state.SkipWithError("the parse differs from the piece");
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * bytes.size()));
}
BENCHMARK(BM_ProtobufFromByteBuffer)
    ->ComputeStatistics("min", Min)
    ->ArgName("slice_kib")
    ->Arg(8)
    ->Arg(16)
    ->Arg(64);

// The same from one contiguous string: the copy without the slicing.
void BM_ProtobufFromString(benchmark::State& state) {
  const v1::GradientPiece piece = Piece();
  const std::string bytes = piece.SerializeAsString();
  v1::GradientPiece parsed;
  for (auto _ : state) {
    benchmark::DoNotOptimize(parsed.ParseFromString(bytes));
    benchmark::DoNotOptimize(parsed.data().data());
  }
  if (parsed.data() != piece.data()) state.SkipWithError("the parse differs from the piece");
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * bytes.size()));
}
BENCHMARK(BM_ProtobufFromString)->ComputeStatistics("min", Min);

}  // namespace
}  // namespace zo

BENCHMARK_MAIN();
