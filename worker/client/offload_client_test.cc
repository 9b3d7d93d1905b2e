#include "worker/client/offload_client.h"

#include <algorithm>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace zo {
namespace {

using ::testing::HasSubstr;
using ::zo::testing::StatusIs;

ShardMap MakeMap(std::vector<int64_t> sizes, int64_t chunk_elems, int num_servers) {
  std::vector<TensorSpec> tensors;
  for (size_t i = 0; i < sizes.size(); ++i) {
    tensors.push_back({.name = "t" + std::to_string(i), .shape = {sizes[i]}});
  }
  absl::StatusOr<ShardMap> map = ShardMap::Create(std::move(tensors), chunk_elems, num_servers);
  EXPECT_TRUE(map.ok()) << map.status();
  return *std::move(map);
}

// Every property PlanPush promises, for one call.
void CheckPlan(const ShardMap& map, int tensor, int64_t offset, int64_t elems, int64_t elem_bytes,
               int64_t max_piece_bytes) {
  SCOPED_TRACE(::testing::Message()
               << "tensor " << tensor << " offset " << offset << " elems " << elems
               << " elem_bytes " << elem_bytes << " max " << max_piece_bytes << " chunk "
               << map.chunk_elems() << " servers " << map.num_servers());
  const std::vector<PushPiece> pieces =
      PlanPush(map, tensor, offset, elems, elem_bytes, max_piece_bytes);
  const int64_t first = map.TensorRange(tensor).begin + offset;
  const int64_t max_elems = std::max<int64_t>(1, max_piece_bytes / elem_bytes);
  int64_t next_byte = 0;
  for (const PushPiece& p : pieces) {
    // Byte ranges tile the pushed span in order: every element exactly once.
    EXPECT_EQ(p.byte_begin, next_byte);
    EXPECT_GT(p.byte_end, p.byte_begin);
    EXPECT_EQ((p.byte_end - p.byte_begin) % elem_bytes, 0);
    EXPECT_LE(p.byte_end - p.byte_begin, max_elems * elem_bytes);
    next_byte = p.byte_end;
    // The piece sits inside its chunk, on the chunk's server, at the flat
    // position its bytes come from.
    const int64_t len = (p.byte_end - p.byte_begin) / elem_bytes;
    const FlatRange chunk = map.ChunkRange(p.chunk);
    EXPECT_GE(p.chunk_offset, 0);
    EXPECT_LE(p.chunk_offset + len, chunk.size());
    EXPECT_EQ(p.server, map.ServerOfChunk(p.chunk));
    EXPECT_EQ(chunk.begin + p.chunk_offset, first + p.byte_begin / elem_bytes);
  }
  EXPECT_EQ(next_byte, elems * elem_bytes);
}

TEST(PlanPushTest, TensorAcrossChunksAndServers) {
  // t1 covers flat [5, 28): chunks 0 (server 0), 1 (1), 2 (2), 3 (0).
  const ShardMap map = MakeMap({5, 23, 7}, /*chunk_elems=*/8, /*num_servers=*/3);
  EXPECT_EQ(PlanPush(map, 1, 0, 23, 2, /*max_piece_bytes=*/1 << 20),
            (std::vector<PushPiece>{
                {.server = 0, .chunk = 0, .chunk_offset = 5, .byte_begin = 0, .byte_end = 6},
                {.server = 1, .chunk = 1, .chunk_offset = 0, .byte_begin = 6, .byte_end = 22},
                {.server = 2, .chunk = 2, .chunk_offset = 0, .byte_begin = 22, .byte_end = 38},
                {.server = 0, .chunk = 3, .chunk_offset = 0, .byte_begin = 38, .byte_end = 46},
            }));
}

TEST(PlanPushTest, PiecesRespectMaxPieceBytes) {
  const ShardMap map = MakeMap({5, 23, 7}, 8, 3);
  // 7 bytes of fp16 round down to 3 elements per piece.
  EXPECT_EQ(PlanPush(map, 1, 0, 11, 2, /*max_piece_bytes=*/7),
            (std::vector<PushPiece>{
                {.server = 0, .chunk = 0, .chunk_offset = 5, .byte_begin = 0, .byte_end = 6},
                {.server = 1, .chunk = 1, .chunk_offset = 0, .byte_begin = 6, .byte_end = 12},
                {.server = 1, .chunk = 1, .chunk_offset = 3, .byte_begin = 12, .byte_end = 18},
                {.server = 1, .chunk = 1, .chunk_offset = 6, .byte_begin = 18, .byte_end = 22},
            }));
}

TEST(PlanPushTest, RangeStartsInsideTheTensor) {
  const ShardMap map = MakeMap({5, 23, 7}, 8, 3);
  // Elements [4, 14) of t1 are flat [9, 19).
  EXPECT_EQ(PlanPush(map, 1, 4, 10, 4, 1 << 20),
            (std::vector<PushPiece>{
                {.server = 1, .chunk = 1, .chunk_offset = 1, .byte_begin = 0, .byte_end = 28},
                {.server = 2, .chunk = 2, .chunk_offset = 0, .byte_begin = 28, .byte_end = 40},
            }));
  EXPECT_TRUE(PlanPush(map, 1, 4, 0, 4, 1 << 20).empty());
}

TEST(PlanPushTest, PropertiesHoldAcrossShapes) {
  for (int64_t chunk : {1, 3, 8, 64}) {
    for (int servers : {1, 2, 5}) {
      const ShardMap map = MakeMap({1, 17, 100, 3}, chunk, servers);
      for (int64_t max_piece_bytes : {1, 2, 6, 9, 64, 1 << 20}) {
        for (int64_t elem_bytes : {2, 4}) {
          for (int t = 0; t < 4; ++t) {
            const int64_t n = map.TensorRange(t).size();
            CheckPlan(map, t, 0, n, elem_bytes, max_piece_bytes);
            CheckPlan(map, t, n / 3, n - n / 3 - n / 4, elem_bytes, max_piece_bytes);
          }
        }
      }
    }
  }
}

std::vector<int64_t> VersionsFor(const DpuConfig& dpu, int64_t last_step) {
  std::vector<int64_t> versions;
  for (int64_t s = 1; s <= last_step; ++s) versions.push_back(VersionForStep(dpu, s));
  return versions;
}

TEST(VersionForStepTest, WithoutDpuEveryStepUsesThePreviousVersion) {
  EXPECT_THAT(VersionsFor({.enabled = false, .warmup_steps = 3}, 6),
              ::testing::ElementsAre(0, 1, 2, 3, 4, 5));
}

TEST(VersionForStepTest, DpuWithoutWarmupRunsOneVersionBehind) {
  // Step 1 can only use the initial weights.
  EXPECT_THAT(VersionsFor({.enabled = true, .warmup_steps = 0}, 6),
              ::testing::ElementsAre(0, 0, 1, 2, 3, 4));
}

TEST(VersionForStepTest, DpuWaitsDuringWarmup) {
  // "For the first 3 steps the worker waits for v_t before step t+1": steps
  // 2..4 use v_{s-1}; from step 5 on, v_{s-2}.
  EXPECT_THAT(VersionsFor({.enabled = true, .warmup_steps = 3}, 7),
              ::testing::ElementsAre(0, 1, 2, 3, 3, 4, 5));
}

TEST(VersionForStepTest, NothingOlderThanTheRestoredBase) {
  const DpuConfig dpu{.enabled = true, .warmup_steps = 0};
  EXPECT_EQ(VersionForStep(dpu, 21, /*base=*/20), 20);
  EXPECT_EQ(VersionForStep(dpu, 22, /*base=*/20), 20);
  EXPECT_EQ(VersionForStep(dpu, 23, /*base=*/20), 21);
}

constexpr char kFp16Config[] = R"({"train_batch_size": 1, "fp16": {"enabled": true}})";

TEST(OffloadClientTest, OpenRejectsATensorOfAnotherDtype) {
  ClientOptions options;
  options.job = "job";
  options.servers = {"127.0.0.1:1"};
  std::vector<TensorSpec> manifest = {
      {.name = "w", .shape = {4}, .dtype = DType::kFloat16},
      {.name = "b", .shape = {4}, .dtype = DType::kFloat32},
  };
  // INVALID_ARGUMENT, not UNAVAILABLE: refused before any connection is tried.
  EXPECT_THAT(
      OffloadClient::Open(options, kFp16Config, manifest),
      StatusIs(absl::StatusCode::kInvalidArgument,
               ::testing::AllOf(HasSubstr("'b'"), HasSubstr("fp32"), HasSubstr("fp16.enabled"))));
}

TEST(OffloadClientTest, OpenRefusesADpuCompensationNoWorkerApplies) {
  std::vector<TensorSpec> manifest = {{.name = "w", .shape = {4}}};
  ClientOptions options;
  options.servers = {"127.0.0.1:1"};
  options.job = "job";
  const std::string config = R"({"train_micro_batch_size_per_gpu": 1,
      "zo": {"dpu": {"enabled": true, "compensation": "worker"}}})";
  EXPECT_THAT(
      OffloadClient::Open(options, config, manifest),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("zo.dpu.compensation \"worker\"")));
}

TEST(OffloadClientTest, OpenRejectsBadOptions) {
  std::vector<TensorSpec> manifest = {{.name = "w", .shape = {4}}};
  ClientOptions options;
  options.servers = {"127.0.0.1:1"};
  options.job = "no spaces";
  EXPECT_THAT(OffloadClient::Open(options, kFp16Config, manifest),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("job name")));
  options.job = "job";
  options.dp_rank = 1;
  EXPECT_THAT(OffloadClient::Open(options, kFp16Config, manifest),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("dp_rank 1")));
  options.dp_rank = 0;
  options.servers.clear();
  EXPECT_THAT(OffloadClient::Open(options, kFp16Config, manifest),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("no servers")));
  // Port 0 is for listening; a client has nowhere to connect.
  options.servers = {"127.0.0.1:1", "127.0.0.1:0"};
  EXPECT_THAT(
      OffloadClient::Open(options, kFp16Config, manifest),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("'127.0.0.1:0' is not host:port")));
}

TEST(OffloadClientTest, OpenGivesUpOnAServerThatDoesNotListen) {
  ClientOptions options;
  options.job = "job";
  options.servers = {"127.0.0.1:1"};
  options.retry_for = absl::Milliseconds(300);
  std::vector<TensorSpec> manifest = {{.name = "w", .shape = {4}, .dtype = DType::kFloat16}};
  EXPECT_THAT(OffloadClient::Open(options, kFp16Config, manifest),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("server 127.0.0.1:1: ")));
}

}  // namespace
}  // namespace zo
