// A server refuses, at startup and naming the flag, directories it could
// not use later, and a port another server already holds.
#include "server/startup_checks.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "common/testing/small_tmpfs.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "offload/io/direct_file.h"
#include "server/offload_server.h"

namespace zo {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::zo::testing::IsOk;
using ::zo::testing::StatusIs;

std::string FreshDir(const std::string& name) {
  const std::string dir =
      ::testing::TempDir() + "/zo_startup_" + name + "_" + std::to_string(getpid());
  std::filesystem::remove_all(dir);
  return dir;
}

TEST(StartupChecksTest, AMissingCheckpointDirIsCreatedAndLeftClean) {
  const std::string dir = FreshDir("ckpt") + "/a/b";
  ASSERT_THAT(CheckCheckpointDir(dir, "--checkpoint-dir"), IsOk());
  EXPECT_TRUE(std::filesystem::is_directory(dir));
  EXPECT_TRUE(std::filesystem::is_empty(dir));  // the probe file is gone
}

TEST(StartupChecksTest, APathThatCannotBeADirectoryIsNamedWithTheFlag) {
  const std::string file = FreshDir("file");
  std::ofstream(file) << "x";
  EXPECT_THAT(CheckCheckpointDir(file, "--checkpoint-dir"),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr("--checkpoint-dir"), HasSubstr(file))));
  EXPECT_THAT(CheckCheckpointDir(file + "/below", "--checkpoint-dir"),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("cannot create")));
  // /proc takes no new directories, even from root.
  EXPECT_THAT(CheckNvmeDir("/proc/zo-nvme", "--nvme-path"),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr("--nvme-path"), HasSubstr("/proc/zo-nvme"))));
  std::filesystem::remove(file);
}

// A full checkpoint disk is no reason to stay down: the chaos soak's
// follower restarted on a full disk exited, and its job could not roll back
// onto it until space came back.
TEST(StartupChecksTest, AFullCheckpointDiskIsAcceptedAndLeftAsItWas) {
  const std::string dir = FreshDir("full");
  ::zo::testing::SmallTmpfs disk(dir, "64k");
  if (!disk.mounted()) GTEST_SKIP() << disk.error();
  ASSERT_THAT(disk.Fill(), IsOk());
  ASSERT_THAT(CheckCheckpointDir(dir, "--checkpoint-dir"), IsOk());
  int entries = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) entries += e.exists();
  EXPECT_EQ(entries, 1) << "only the filler: no probe file left behind";
}

TEST(StartupChecksTest, AnNvmeDirMustTakeDirectIo) {
  const std::string dir = FreshDir("nvme");
  std::filesystem::create_directories(dir);
  const absl::Status direct = CheckDirectIo(dir);
  // The same verdict as the I/O layer's, with the flag in front.
  if (direct.ok()) {
    EXPECT_THAT(CheckNvmeDir(dir, "--nvme-path"), IsOk());
  } else {
    EXPECT_THAT(CheckNvmeDir(dir, "--nvme-path"),
                StatusIs(absl::StatusCode::kFailedPrecondition,
                         AllOf(HasSubstr("--nvme-path"), HasSubstr("O_DIRECT"))));
  }
}

TEST(StartupChecksTest, OffloadServerStartRefusesABadCheckpointDir) {
  ServerOptions options;
  options.listen = "";
  options.checkpoint_dir = "/proc/zo-checkpoints";
  EXPECT_THAT(OffloadServer::Start(options).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("--checkpoint-dir")));
}

TEST(ListenTest, ASecondServerOnTheSamePortIsRefused) {
  ServerOptions options;
  options.listen = "127.0.0.1:0";
  auto first = OffloadServer::Start(options);
  ASSERT_TRUE(first.ok()) << first.status();
  options.listen = "127.0.0.1:" + std::to_string((*first)->port());
  EXPECT_THAT(OffloadServer::Start(options).status(),
              StatusIs(absl::StatusCode::kUnavailable,
                       AllOf(HasSubstr(options.listen), HasSubstr("in use"))));
  (*first)->Shutdown(absl::Seconds(1));
}

}  // namespace
}  // namespace zo
