#include "worker/model/partition.h"

#include <numeric>
#include <random>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace zo::model {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::vector<LayerWeightInfo> GptLike(int blocks) {
  std::vector<LayerWeightInfo> layers = {{"embedding", 1000}};
  for (int i = 0; i < blocks; ++i) layers.push_back({"block", 500});
  layers.push_back({"layernorm", 10});
  layers.push_back({"linear", 900});
  return layers;
}

TEST(PartitionTest, UniformMatchesDeepSpeedPartitionUniform) {
  // partition_uniform(10, 4): chunks of 2, the first 10 mod 4 = 2 parts get one more.
  std::vector<LayerWeightInfo> layers(10, {"x", 1});
  EXPECT_THAT(*PartitionLayers(layers, 4, "uniform"), ElementsAre(0, 3, 6, 8, 10));
  EXPECT_THAT(*PartitionLayers(layers, 1, "uniform"), ElementsAre(0, 10));
}

TEST(PartitionTest, ParametersBalanceTheHeaviestStage) {
  // 1000, 4 x 500, 10, 900: no cut into 3 parts stays under 1500.
  auto bounds = PartitionLayers(GptLike(4), 3, "parameters");
  ASSERT_TRUE(bounds.ok()) << bounds.status();
  // Optimum 1500; each part takes what fits, earlier parts first: 1500 | 1500 | 910.
  EXPECT_THAT(*bounds, ElementsAre(0, 2, 5, 7));
}

TEST(PartitionTest, TypeRegexBalancesOnlyMatchingLayers) {
  auto bounds = PartitionLayers(GptLike(4), 2, "type:BLOCK");  // case-insensitive
  ASSERT_TRUE(bounds.ok()) << bounds.status();
  EXPECT_THAT(*bounds, ElementsAre(0, 3, 7));  // embed + 2 blocks | 2 blocks + ln + head
  auto regex = PartitionLayers(GptLike(4), 2, "type:^(block|linear)$");
  ASSERT_TRUE(regex.ok()) << regex.status();
  EXPECT_THAT(*regex, ElementsAre(0, 4, 7));  // 3 matches | 2 matches
}

TEST(PartitionTest, BalancedCutIsOptimalAgainstBruteForce) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 300; ++trial) {
    const int n = 1 + static_cast<int>(rng() % 9);
    const int parts = 1 + static_cast<int>(rng() % n);
    std::vector<int64_t> w(n);
    for (auto& x : w) x = static_cast<int64_t>(rng() % 5);  // zeros included
    // Brute force over all cut positions (bitmask of n - 1 gaps).
    int64_t best = INT64_MAX;
    for (uint32_t mask = 0; mask < (1u << (n - 1)); ++mask) {
      if (__builtin_popcount(mask) != parts - 1) continue;
      int64_t worst = 0, sum = 0;
      for (int i = 0; i < n; ++i) {
        sum += w[i];
        if (i == n - 1 || (mask >> i & 1)) {
          worst = std::max(worst, sum);
          sum = 0;
        }
      }
      best = std::min(best, worst);
    }
    const std::vector<int> b = BalancedBoundaries(w, parts);
    ASSERT_EQ(b.size(), static_cast<size_t>(parts + 1));
    ASSERT_EQ(b.front(), 0);
    ASSERT_EQ(b.back(), n);
    int64_t worst = 0;
    for (int p = 0; p < parts; ++p) {
      ASSERT_LT(b[p], b[p + 1]) << "empty part " << p;
      worst = std::max(worst, std::accumulate(w.begin() + b[p], w.begin() + b[p + 1], int64_t{0}));
    }
    EXPECT_EQ(worst, best) << "trial " << trial;
  }
}

TEST(PartitionTest, ErrorsNameTheProblem) {
  EXPECT_THAT(PartitionLayers(GptLike(1), 5, "parameters").status().message(),
              HasSubstr("cannot cut 4 layers into 5 pipeline stages"));
  EXPECT_THAT(PartitionLayers(GptLike(2), 2, "balanced").status().message(),
              HasSubstr("unknown partition method 'balanced'"));
  EXPECT_THAT(PartitionLayers(GptLike(2), 2, "type:conv").status().message(),
              HasSubstr("no layer type matches 'conv'"));
  EXPECT_THAT(PartitionLayers(GptLike(2), 2, "type:(").status().message(),
              HasSubstr("bad regular expression"));
}

}  // namespace
}  // namespace zo::model
