// `zo-bench wire` end to end at a toy size: the forked server process, the
// client library, the TCP baseline and the JSON line (no assertion on speed),
// plus the option checks.
#include "bench/wire_bench.h"

#include <sstream>
#include <string>

#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace zo::bench {
namespace {

using ::testing::HasSubstr;
using ::zo::testing::IsOk;
using ::zo::testing::StatusIs;

TEST(WireBenchOptionsTest, NamesTheBadFlag) {
  WireBenchOptions o;
  EXPECT_TRUE(ValidateWireBenchOptions(o).ok());
  o.bytes = 3;
  EXPECT_THAT(ValidateWireBenchOptions(o),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--bytes")));
  o = WireBenchOptions();
  o.piece_bytes = int64_t{64} << 20;
  EXPECT_THAT(ValidateWireBenchOptions(o),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--piece-bytes")));
  o = WireBenchOptions();
  o.rounds = 0;
  EXPECT_THAT(ValidateWireBenchOptions(o),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--rounds")));
  o = WireBenchOptions();
  o.warmup_rounds = -1;
  EXPECT_THAT(ValidateWireBenchOptions(o),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--warmup-rounds")));
  o = WireBenchOptions();
  o.in_flight_bytes = 0;
  EXPECT_THAT(ValidateWireBenchOptions(o),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--in-flight-bytes")));
}

// Forks: must run while this test process has a single thread (gtest starts
// none; nothing before this test uses gRPC).
TEST(WireBenchTest, SmallRunPrintsOneJsonLine) {
  WireBenchOptions o;
  o.bytes = int64_t{8} << 20;
  o.rounds = 1;
  o.warmup_rounds = 1;
  o.chunk_elems = int64_t{1} << 20;  // four chunks: several pieces and chunks per push
  o.json = true;
  std::ostringstream out;
  ASSERT_THAT(RunWireBench(o, out), IsOk());
  const std::string text = out.str();
  ASSERT_EQ(text.find('\n'), text.size() - 1) << text;  // exactly one line
  const nlohmann::json j = nlohmann::json::parse(text);
  EXPECT_EQ(j.at("bench"), "wire");
  EXPECT_EQ(j.at("bytes"), o.bytes);
  EXPECT_EQ(j.at("rounds"), 1);
  EXPECT_EQ(j.at("piece_bytes"), o.piece_bytes);
  EXPECT_GT(j.at("grpc_gb_per_s").get<double>(), 0);
  EXPECT_GT(j.at("tcp_gb_per_s").get<double>(), 0);
  EXPECT_GT(j.at("ratio").get<double>(), 0);
}

}  // namespace
}  // namespace zo::bench
