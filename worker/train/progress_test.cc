#include "worker/train/progress.h"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "offload/checkpoint/checkpoint_test_util.h"

namespace zo::train {
namespace {

std::vector<nlohmann::json> Lines(const std::string& path) {
  std::vector<nlohmann::json> out;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) out.push_back(nlohmann::json::parse(line));
  return out;
}

TEST(ProgressTest, AStepWhoseOutcomeNoReplyCanTellHoldsBackNoLineAfterIt) {
  const std::string dir = zo::testing::FreshTestDir("progress_test");
  const std::string metrics = dir + "/m.jsonl";
  std::FILE* out = std::tmpfile();
  ZO_ASSERT_OK_AND_ASSIGN(Progress progress, Progress::Open(out, 6, 100, 1, metrics));
  StepOutcomes outcomes;
  const auto step = [&](int64_t s) {
    return progress.Step({.step = s, .loss = 1.0 / s, .loss_scale = 4096}, outcomes);
  };
  outcomes.Observe(6, 6, false, 1, 1);
  ASSERT_THAT(step(6), zo::testing::IsOk());
  ASSERT_THAT(step(7), zo::testing::IsOk());
  ASSERT_THAT(step(8), zo::testing::IsOk());
  EXPECT_EQ(Lines(metrics).size(), 1u);  // 7 and 8 wait for a reply
  // The next reply jumps to 9 with one skip in 7..9 that it does not place.
  outcomes.Observe(9, 8, false, 1, 1);
  ASSERT_THAT(step(9), zo::testing::IsOk());
  const std::vector<nlohmann::json> lines = Lines(metrics);
  ASSERT_EQ(lines.size(), 4u);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(lines[i]["step"], 6 + i);
  EXPECT_TRUE(lines[1]["skipped"].is_null());
  EXPECT_TRUE(lines[2]["skipped"].is_null());
  EXPECT_EQ(lines[3]["skipped"], false);
  EXPECT_EQ(lines[3]["grad_norm"], 1.0);
  std::fclose(out);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace zo::train
