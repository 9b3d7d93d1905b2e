// zo-ctl rescale with real processes: a job trained by a running zo-train
// moves from 2 servers to 3, then to 1, and the worker follows it without a
// restart; every step's loss equals, bit for bit, that of a run that never
// moved. A move whose new servers are not all up fails, says how to finish
// it, and finishes once they are.
#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "rpc/error_detail.h"
#include "tests/cli/zo_ctl_runner.h"
#include "tests/server/server_process.h"
#include "tests/server/training_harness.h"
#include "tests/support/child_process.h"
#include "tests/train/train_run.h"

namespace zo::testing {
namespace {

using ::testing::HasSubstr;

using RescaleTest = RunningJobTest;

TEST_F(RescaleTest, TwoToThreeToOneServersKeepsTheTrajectoryAndTheWorker) {
  std::vector<ServerProcess> servers;
  for (int i = 0; i < 3; ++i) servers.push_back(StartServer());
  ChildProcess train = StartTrain(Join(servers, {0, 1}));

  ASSERT_TRUE(WaitForSteps(metrics(), 5, train)) << train.ReadLog();
  ZoCtlResult r = RunZoCtl(absl::StrCat("rescale --server ", servers[0].address(),
                                        " --job mv --servers ", Join(servers, {0, 1, 2})));
  ASSERT_EQ(r.exit_code, 0) << r.err << train.ReadLog();
  EXPECT_THAT(r.out, HasSubstr(absl::StrCat("job mv moved from ", Join(servers, {0, 1}), " to ",
                                            Join(servers, {0, 1, 2}), " at version ")));

  ASSERT_TRUE(WaitForSteps(metrics(), 15, train)) << train.ReadLog();
  // Named through a follower: the lead of the job is found from it.
  r = RunZoCtl(absl::StrCat("rescale --json --server ", servers[1].address(),
                            " --job mv --servers ", Join(servers, {2})));
  ASSERT_EQ(r.exit_code, 0) << r.err << train.ReadLog();
  const nlohmann::json moved = nlohmann::json::parse(r.out.substr(r.out.find('{')));
  EXPECT_EQ(moved["to"], nlohmann::json::array({servers[2].address()}));
  EXPECT_GE(moved["version"].get<int64_t>(), 15);

  ExpectTheReferenceTrajectory(train);
  const std::string log = train.ReadLog();
  EXPECT_THAT(log, HasSubstr(absl::StrCat("moved to ", Join(servers, {0, 1, 2}))));
  EXPECT_THAT(log, HasSubstr(absl::StrCat("moved to ", Join(servers, {2}), " at version ")));
  EXPECT_THAT(log, HasSubstr("following it"));

  // The old servers say where the job went; the new one has it.
  r = RunZoCtl(absl::StrCat("status --server ", servers[0].address(), " --job mv"));
  EXPECT_EQ(r.exit_code, 1);
  if (!RewordErrorsForTesting()) {
    EXPECT_THAT(r.err, HasSubstr(absl::StrCat("moved to servers [", servers[2].address(), "]")));
  }
  r = RunZoCtl(absl::StrCat("jobs --server ", Join(servers, {0, 1, 2})));
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr(servers[2].address()));
  EXPECT_THAT(r.out, ::testing::Not(HasSubstr(servers[0].address())));
}

TEST_F(RescaleTest, AMoveToAServerThatIsDownFinishesOnceItIsUp) {
  std::vector<ServerProcess> servers;
  for (int i = 0; i < 2; ++i) servers.push_back(StartServer());
  const int down_port = servers[1].port();
  servers[1].Kill();  // the new server, not up yet
  ChildProcess train = StartTrain(Join(servers, {0}));
  ASSERT_TRUE(WaitForSteps(metrics(), 5, train)) << train.ReadLog();

  const std::string to = Join(servers, {0, 1});
  ZoCtlResult r =
      RunZoCtl(absl::StrCat("rescale --server ", servers[0].address(), " --job mv --servers ", to));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr(servers[1].address()));
  EXPECT_THAT(r.err, HasSubstr("finish with: zo-ctl rescale --checkpoint "));
  const std::string prefix = "--checkpoint ";
  const size_t at = r.err.find(prefix);
  ASSERT_NE(at, std::string::npos);
  const std::string checkpoint =
      r.err.substr(at + prefix.size(), r.err.find(' ', at + prefix.size()) - at - prefix.size());

  // The worker waits, saying so, while the job is nowhere.
  servers[1] = StartServer(down_port);
  r = RunZoCtl(absl::StrCat("rescale --checkpoint ", checkpoint, " --servers ", to));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  ExpectTheReferenceTrajectory(train);
  EXPECT_THAT(train.ReadLog(), HasSubstr(absl::StrCat("moved to ", to)));
}

TEST_F(RescaleTest, BadRequestsChangeNothing) {
  ServerProcess a = StartServer();
  ChildProcess train = StartTrain(a.address());
  ASSERT_TRUE(WaitForSteps(metrics(), 3, train)) << train.ReadLog();
  ZoCtlResult r = RunZoCtl(absl::StrCat("rescale --server ", a.address(), " --job mv --servers ",
                                        a.address(), ",", a.address()));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("twice"));
  r = RunZoCtl(absl::StrCat("rescale --server ", a.address(), " --job mv --servers ", a.address()));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("already"));
  r = RunZoCtl(
      absl::StrCat("rescale --server ", a.address(), " --job nosuch --servers 127.0.0.1:1"));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("NOT_FOUND"));
  // Training went on untouched.
  ExpectTheReferenceTrajectory(train);
}

}  // namespace
}  // namespace zo::testing
