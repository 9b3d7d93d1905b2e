// The pure pieces of `zo-bench nvme`: size flags, fio's JSON report (real
// fio 3.33 output captured on a Debian 12 machine, bench/testdata/) and the
// mountinfo lookup that names the device under the file.
#include "bench/nvme_bench.h"

#include <fstream>
#include <sstream>
#include <string>

#include "bench/file_location.h"
#include "bench/fio.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace zo::bench {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::zo::testing::StatusIs;

std::string ReadTestdata(const std::string& name) {
  // Tests run from the repository root (zo_cc_test's WORKING_DIRECTORY).
  std::ifstream in("bench/testdata/" + name);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

TEST(ParseByteSizeTest, AcceptsBytesAndBinarySuffixes) {
  EXPECT_EQ(*ParseByteSize("1073741824"), uint64_t{1} << 30);
  EXPECT_EQ(*ParseByteSize("1G"), uint64_t{1} << 30);
  EXPECT_EQ(*ParseByteSize("1g"), uint64_t{1} << 30);
  EXPECT_EQ(*ParseByteSize("1Gi"), uint64_t{1} << 30);
  EXPECT_EQ(*ParseByteSize("1GiB"), uint64_t{1} << 30);
  EXPECT_EQ(*ParseByteSize("4k"), 4096u);
  EXPECT_EQ(*ParseByteSize("4KiB"), 4096u);
  EXPECT_EQ(*ParseByteSize("512M"), uint64_t{512} << 20);
  EXPECT_EQ(*ParseByteSize("2T"), uint64_t{2} << 40);
}

TEST(ParseByteSizeTest, RefusesAmbiguousAndBadInput) {
  EXPECT_THAT(ParseByteSize("1GB"), StatusIs(absl::StatusCode::kInvalidArgument,
                                             HasSubstr("ambiguous: write 1G or 1GiB")));
  EXPECT_THAT(ParseByteSize(""), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("''")));
  EXPECT_THAT(ParseByteSize("0"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("positive integer")));
  EXPECT_THAT(ParseByteSize("-1G"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("positive integer")));
  EXPECT_THAT(ParseByteSize("1.5G"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("unknown unit")));
  EXPECT_THAT(ParseByteSize("3X"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("unknown unit")));
  EXPECT_THAT(ParseByteSize("5000000T"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("too large")));
}

TEST(FioArgsTest, SameWorkAsOurSide) {
  FioJob job;
  job.binary = "/usr/bin/fio";
  job.filename = "/nvme/f.bin";
  job.rw = "write";
  job.size = uint64_t{1} << 30;
  job.bs = 1 << 20;
  job.iodepth = 8;
  EXPECT_THAT(FioArgs(job),
              ElementsAre("/usr/bin/fio", "--output-format=json", "--name=zo-bench-write",
                          "--filename=/nvme/f.bin", "--rw=write", "--bs=1048576", "--iodepth=8",
                          "--size=1073741824", "--ioengine=io_uring", "--direct=1", "--numjobs=1"));
  job.extra_args = {"--fixedbufs=1"};
  EXPECT_EQ(FioArgs(job).back(), "--fixedbufs=1");
}

TEST(ParseFioJsonTest, ReadReport) {
  const std::string text = ReadTestdata("fio_3.33_read_io_uring.json");
  ASSERT_FALSE(text.empty());
  ZO_ASSERT_OK_AND_ASSIGN(FioResult r, ParseFioJson(text, "read"));
  EXPECT_EQ(r.io_bytes, 268435456u);
  EXPECT_EQ(r.runtime_ms, 87u);
  EXPECT_DOUBLE_EQ(r.bytes_per_s, 3085465011.0);
}

TEST(ParseFioJsonTest, WriteReportWithWarningsBeforeIt) {
  const std::string text = "fio: this platform does not support process shared mutexes\n" +
                           ReadTestdata("fio_3.33_write_io_uring.json");
  ZO_ASSERT_OK_AND_ASSIGN(FioResult r, ParseFioJson(text, "write"));
  EXPECT_EQ(r.io_bytes, 268435456u);
  EXPECT_EQ(r.runtime_ms, 305u);
  EXPECT_DOUBLE_EQ(r.bytes_per_s, 880116249.0);
}

TEST(ParseFioJsonTest, WrongDirectionMovedNothing) {
  EXPECT_THAT(ParseFioJson(ReadTestdata("fio_3.33_read_io_uring.json"), "write"),
              StatusIs(absl::StatusCode::kInternal, HasSubstr("moved no write bytes")));
}

TEST(ParseFioJsonTest, JobError) {
  const std::string text = R"({"jobs": [{"error": 5, "read": {}}]})";
  EXPECT_THAT(ParseFioJson(text, "read"),
              StatusIs(absl::StatusCode::kInternal, HasSubstr("error 5")));
}

TEST(ParseFioJsonTest, NotAReport) {
  EXPECT_THAT(ParseFioJson("fio: failed to open file\n", "read"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("no JSON report")));
  EXPECT_THAT(ParseFioJson("{ not json }", "read"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("not valid JSON")));
  EXPECT_THAT(ParseFioJson(R"({"jobs": []})", "read"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("exactly one job")));
  EXPECT_THAT(ParseFioJson(R"({"jobs": [{"error": 0, "read": {"io_bytes": 1}}]})", "read"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("read.runtime")));
}

// Lines as in /proc/self/mountinfo (proc(5)), including an optional field
// and an escaped space.
constexpr char kMountinfo[] =
    "21 26 0:20 / /proc rw,relatime - proc proc rw\n"
    "26 1 254:0 / / rw,relatime - ext4 /dev/vda rw,discard\n"
    "40 26 259:2 / /mnt/nvme rw,noatime shared:7 - xfs /dev/nvme0n1p2 rw,attr2\n"
    "41 26 259:3 / /mnt/nvme\\040data rw - ext4 /dev/nvme1n1 rw\n"
    "42 26 0:45 /@home /home rw shared:9 - btrfs /dev/sda2 rw,subvol=/@home\n";

TEST(FindMountTest, DeepestMountOfTheDevice) {
  std::optional<FileLocation> loc = FindMount(kMountinfo, 259, 2, "/mnt/nvme/zo/raw.bin");
  ASSERT_TRUE(loc.has_value());
  EXPECT_EQ(loc->source, "/dev/nvme0n1p2");
  EXPECT_EQ(loc->fs_type, "xfs");
  EXPECT_EQ(loc->mount_point, "/mnt/nvme");
  EXPECT_EQ(loc->ToString(), "/dev/nvme0n1p2 (xfs at /mnt/nvme, dev 259:2)");
}

TEST(FindMountTest, RootAndEscapedMountPoint) {
  EXPECT_EQ(FindMount(kMountinfo, 254, 0, "/var/tmp/x")->source, "/dev/vda");
  EXPECT_EQ(FindMount(kMountinfo, 259, 3, "/mnt/nvme data/x")->mount_point, "/mnt/nvme data");
  // "/mnt/nvmefoo" is not under "/mnt/nvme".
  EXPECT_EQ(FindMount(kMountinfo, 254, 0, "/mnt/nvmefoo/x")->mount_point, "/");
}

TEST(FindMountTest, DeviceNumberNotInMountinfoFallsBackToThePath) {
  // btrfs gives files an anonymous st_dev that no mountinfo line carries.
  std::optional<FileLocation> loc = FindMount(kMountinfo, 0, 51, "/home/me/x");
  ASSERT_TRUE(loc.has_value());
  EXPECT_EQ(loc->source, "/dev/sda2");
  EXPECT_EQ(loc->dev_minor, 51u);
  EXPECT_FALSE(FindMount("", 254, 0, "/x").has_value());
}

TEST(NvmeBenchOptionsTest, NamesTheBadFlag) {
  NvmeBenchOptions o;
  EXPECT_TRUE(ValidateNvmeBenchOptions(o).ok());
  o.bs = 3 << 20;
  EXPECT_THAT(ValidateNvmeBenchOptions(o),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--bs")));
  o = NvmeBenchOptions();
  o.size = (uint64_t{1} << 30) + 4096;
  EXPECT_THAT(ValidateNvmeBenchOptions(o),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("multiple of --bs")));
  o = NvmeBenchOptions();
  o.fio_engine = "sync";
  EXPECT_THAT(ValidateNvmeBenchOptions(o),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--fio-engine")));
  o = NvmeBenchOptions();
  o.buffer_count = 2;
  EXPECT_THAT(ValidateNvmeBenchOptions(o),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--buffer-count")));
}

}  // namespace
}  // namespace zo::bench
