// Reading one pushed GradientPiece as gRPC hands it to PushGradients: a
// ByteBuffer of separately allocated slices, the header in the first. The
// view parsers (by hand, and with protobuf's CodedInputStream) leave the
// payload in the slices; protobuf's own parse, what a typed handler would do,
// copies it into the message and is the baseline they must beat.
// Bytes per second count the whole serialised piece.
//
//   build/release/bin/gradient_piece_view_benchmark --benchmark_repetitions=10
//       --benchmark_report_aggregates_only=true
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "benchmark/benchmark.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/proto_buffer_reader.h"
#include "proto/zo/v1/gradients.pb.h"
#include "server/gradient_piece_view.h"

namespace zo {
namespace {

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
    ->ArgName("slice_kib")
    ->Arg(8)
    ->Arg(16)
    ->Arg(64);
BENCHMARK_CAPTURE(BM_View, coded_input_stream, &ParseGradientPieceCoded)
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
BENCHMARK(BM_DumpOnly)->ArgName("slice_kib")->Arg(8)->Arg(16)->Arg(64);

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
BENCHMARK(BM_ProtobufFromByteBuffer)->ArgName("slice_kib")->Arg(8)->Arg(16)->Arg(64);

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
BENCHMARK(BM_ProtobufFromString);

}  // namespace
}  // namespace zo

BENCHMARK_MAIN();
