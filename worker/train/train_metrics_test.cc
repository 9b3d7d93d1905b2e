#include "worker/train/train_metrics.h"

#include <map>
#include <string>

#include "gtest/gtest.h"

namespace zo::train {
namespace {

// Summed over its phases, zo_train_step_seconds_total is the steps' time,
// and each part keeps its own.
TEST(TrainMetricsTest, StepSecondsSummedOverPhaseAreTheSteps) {
  TrainMetrics metrics("job", "0", 0);
  metrics.Record({.step = 1,
                  .step_s = 1.0,
                  .compute_s = 0.5,
                  .push_s = 0.1,
                  .wait_s = 0.2,
                  .transfer_s = 0.05},
                 10, 20);
  metrics.Record({.step = 2, .step_s = 2.0, .compute_s = 1.5, .push_s = 0.25}, 30, 40);
  std::map<std::string, double> by_phase;
  for (const prometheus::MetricFamily& f : metrics.Collect()) {
    if (f.name != "zo_train_step_seconds_total") continue;
    for (const prometheus::ClientMetric& m : f.metric) {
      for (const prometheus::ClientMetric::Label& l : m.label) {
        if (l.name == "phase") by_phase[l.value] = m.counter.value;
      }
    }
  }
  ASSERT_EQ(by_phase.size(), 5u);
  double sum = 0;
  for (const auto& [phase, seconds] : by_phase) sum += seconds;
  EXPECT_DOUBLE_EQ(sum, 3.0);
  EXPECT_DOUBLE_EQ(by_phase["compute"], 2.0);
  EXPECT_DOUBLE_EQ(by_phase["push"], 0.35);
  EXPECT_DOUBLE_EQ(by_phase["wait_weights"], 0.2);
  EXPECT_DOUBLE_EQ(by_phase["pipeline"], 0.05);
  EXPECT_DOUBLE_EQ(by_phase["other"], 0.15 + 0.25);
}

}  // namespace
}  // namespace zo::train
