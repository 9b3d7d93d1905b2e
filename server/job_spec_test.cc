#include "server/job_spec.h"

#include <string>

#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace zo {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

v1::OpenJobRequest Request(const std::string& config, int dp) {
  v1::OpenJobRequest r;
  r.set_job("spec");
  v1::TensorSpec* t = r.mutable_manifest()->add_tensors();
  t->set_name("w");
  t->add_shape(100);
  t->set_dtype(v1::DTYPE_FP32);
  r.set_config_json(config);
  r.set_dp_world_size(dp);
  r.add_servers("127.0.0.1:1");
  r.set_server_index(0);
  return r;
}

JobSpec Spec(const std::string& config, int dp = 1) {
  absl::StatusOr<JobSpec> spec = JobSpecFromRequest(Request(config, dp));
  EXPECT_TRUE(spec.ok()) << spec.status();
  return *std::move(spec);
}

// A caller's OpenJob never makes the server build unbounded per-tensor
// records: tensor count, name length and rank are capped, and the error
// quotes a long name only in part.
TEST(JobSpecFromRequestTest, ManifestBoundsAreNamed) {
  const std::string config = R"({"train_batch_size": 1})";
  v1::OpenJobRequest many = Request(config, 1);
  for (int i = 0; i < kMaxManifestTensors; ++i) {
    v1::TensorSpec* t = many.mutable_manifest()->add_tensors();
    t->set_name("t" + std::to_string(i));
    t->add_shape(1);
    t->set_dtype(v1::DTYPE_FP32);
  }
  EXPECT_THAT(JobSpecFromRequest(many).status(),
              testing::StatusIs(absl::StatusCode::kInvalidArgument,
                                HasSubstr("1048577 tensors, more than the 1048576")));
  v1::OpenJobRequest named = Request(config, 1);
  named.mutable_manifest()->mutable_tensors(0)->set_name(std::string(5000, 'x'));
  const absl::Status long_name = JobSpecFromRequest(named).status();
  EXPECT_THAT(long_name, testing::StatusIs(absl::StatusCode::kInvalidArgument,
                                           HasSubstr("names are at most 1024 bytes")));
  EXPECT_LT(long_name.message().size(), 300u);
  v1::OpenJobRequest deep = Request(config, 1);
  for (int i = 0; i < 8; ++i) deep.mutable_manifest()->mutable_tensors(0)->add_shape(1);
  EXPECT_THAT(JobSpecFromRequest(deep).status(),
              testing::StatusIs(absl::StatusCode::kInvalidArgument,
                                HasSubstr("shapes at most 8 dimensions (this one: 1 bytes, 9")));
}

TEST(JobSpecMismatchTest, EqualSpecsAttach) {
  const std::string config = R"({"train_micro_batch_size_per_gpu": 2})";
  EXPECT_EQ(JobSpecMismatch(Spec(config), Spec(config)), "");
  // Spelling a default out is the same config.
  EXPECT_EQ(JobSpecMismatch(Spec(config), Spec(R"({"train_micro_batch_size_per_gpu": 2,
                                                    "steps_per_print": 10})")),
            "");
}

// How many connections a worker opens to each server is its own: workers
// of one job may open different numbers, and a restarted one may change it.
TEST(JobSpecMismatchTest, AWorkersConnectionsAreNotPartOfTheJob) {
  const JobSpec one = Spec(R"({"train_micro_batch_size_per_gpu": 2})");
  const JobSpec four =
      Spec(R"({"train_micro_batch_size_per_gpu": 2, "zo": {"connections_per_server": 4}})");
  EXPECT_EQ(JobSpecMismatch(one, four), "");
}

// The batch size follows from dp_world_size: the width, not the derived
// train_batch_size, is what the message names.
TEST(JobSpecMismatchTest, DpWorldSizeIsNamedWithBothValues) {
  const std::string config = R"({"train_micro_batch_size_per_gpu": 2})";
  EXPECT_EQ(JobSpecMismatch(Spec(config, 2), Spec(config, 4)),
            "dp_world_size 4 differs from the job's 2");
}

TEST(JobSpecMismatchTest, ConfigDifferencesNameEveryKeyAndBothValues) {
  const JobSpec job = Spec(R"({"train_batch_size": 8, "optimizer": {"type": "AdamW",
      "params": {"lr": 0.001, "betas": [0.9, 0.999]}}})");
  const JobSpec other = Spec(R"({"train_batch_size": 8, "gradient_clipping": 1.5,
      "optimizer": {"type": "AdamW", "params": {"lr": 0.002, "betas": [0.9, 0.95]}}})");
  const std::string m = JobSpecMismatch(job, other);
  EXPECT_THAT(m, AllOf(HasSubstr("optimizer.params.lr is 0.002, the job's is 0.001"),
                       HasSubstr("optimizer.params.betas[1] is 0.95, the job's is 0.999"),
                       HasSubstr("gradient_clipping is 1.5, the job's is 0.0")));
  EXPECT_THAT(m, Not(HasSubstr("train_batch_size")));
  EXPECT_THAT(m, Not(HasSubstr("betas[0]")));
}

TEST(JobSpecMismatchTest, AKeyOnlyOneSideHasIsAbsentOnTheOther) {
  const JobSpec job = Spec(R"({"train_batch_size": 8})");
  const JobSpec other = Spec(R"({"train_batch_size": 8, "scheduler": {"type": "WarmupLR",
      "params": {"warmup_num_steps": 5}}})");
  EXPECT_THAT(JobSpecMismatch(job, other),
              HasSubstr("scheduler.params.warmup_num_steps is 5, the job's is absent"));
}

}  // namespace
}  // namespace zo
