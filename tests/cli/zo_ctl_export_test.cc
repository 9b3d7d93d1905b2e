// `zo-ctl export`: a checkpoint written with the offload API, exported by the
// real binary, read back as safetensors.
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "offload/checkpoint/checkpoint_test_util.h"
#include "tests/cli/safetensors_file.h"
#include "tests/cli/zo_ctl_runner.h"

namespace zo {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using ::testing::Not;
using ::zo::testing::FlatState;
using ::zo::testing::FlipByte;
using ::zo::testing::FreshTestDir;
using ::zo::testing::IsOk;
using ::zo::testing::MakeFlatState;
using ::zo::testing::ParseSafetensors;
using ::zo::testing::RunZoCtl;
using ::zo::testing::Safetensors;
using ::zo::testing::WriteTestCheckpoint;
using ::zo::testing::ZoCtlResult;

FlatState TestState(uint64_t seed) {
  return MakeFlatState({{"wte", {500, 64}, DType::kFloat16},
                        {"h.0.attn.w", {64, 192}, DType::kFloat16},
                        {"h.0.ln.b", {64}, DType::kFloat32},
                        {"lm_head", {9000}, DType::kFloat16}},
                       /*chunk_elems=*/10000, /*num_servers=*/2, seed);
}

void ExpectMasterOf(const Safetensors& file, const FlatState& s) {
  ExpectFp32Export(file, s.manifest, s.master);
}

class ZoCtlExportTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = FreshTestDir(::testing::UnitTest::GetInstance()->current_test_info()->name());
  }
  void TearDown() override { fs::remove_all(root_); }
  std::string root_;
};

TEST_F(ZoCtlExportTest, ExportsACheckpointAsSafetensors) {
  const FlatState s = TestState(1);
  ZO_ASSERT_OK_AND_ASSIGN(const std::string dir, WriteTestCheckpoint(root_, "gpt", 12, s));
  const std::string out = root_ + "/gpt.safetensors";
  const ZoCtlResult r = RunZoCtl("export --checkpoint " + dir + " --out " + out);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const int64_t size = static_cast<int64_t>(fs::file_size(out));
  EXPECT_THAT(r.out, HasSubstr(absl::StrCat("exported 4 tensor(s), ", size, " bytes")));
  EXPECT_THAT(r.out, HasSubstr(out));
  EXPECT_THAT(r.err, HasSubstr("[4/4] lm_head"));  // progress on stderr only
  EXPECT_THAT(r.out, Not(HasSubstr("[4/4]")));
  const Safetensors file = ParseSafetensors(out);
  ExpectMasterOf(file, s);
  EXPECT_EQ(file.header["__metadata__"]["zo_version"], "12");
}

TEST_F(ZoCtlExportTest, AJobDirectoryMeansItsLatestCheckpoint) {
  ASSERT_THAT(WriteTestCheckpoint(root_, "gpt", 5, TestState(1)), IsOk());
  const FlatState newer = TestState(2);
  ASSERT_THAT(WriteTestCheckpoint(root_, "gpt", 9, newer), IsOk());
  const std::string out = root_ + "/gpt.safetensors";
  const ZoCtlResult r = RunZoCtl("export --checkpoint " + root_ + "/gpt/ --out " + out);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_THAT(r.err, HasSubstr("step-00000009"));
  const Safetensors file = ParseSafetensors(out);
  ExpectMasterOf(file, newer);
  EXPECT_EQ(file.header["__metadata__"]["zo_version"], "9");
}

TEST_F(ZoCtlExportTest, ACorruptCheckpointFailsWithExitOneAndNoFile) {
  ZO_ASSERT_OK_AND_ASSIGN(const std::string dir,
                          WriteTestCheckpoint(root_, "gpt", 3, TestState(1)));
  ASSERT_THAT(FlipByte(dir + "/part-00000.zop", 4096 + 8), IsOk());
  const std::string out = root_ + "/gpt.safetensors";
  const ZoCtlResult r = RunZoCtl("export --checkpoint " + dir + " --out " + out);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("checksum mismatch"));
  EXPECT_THAT(r.err, HasSubstr("part-00000.zop"));
  EXPECT_FALSE(fs::exists(out));
  EXPECT_FALSE(fs::exists(out + ".tmp"));
}

TEST_F(ZoCtlExportTest, MissingFlagsOrCheckpointAreReported) {
  ZoCtlResult r = RunZoCtl("export --out " + root_ + "/x.safetensors");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("--checkpoint DIR and --out FILE.safetensors"));
  r = RunZoCtl("export --checkpoint " + root_ + "/nothing --out " + root_ + "/x.safetensors");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr(root_ + "/nothing"));
  EXPECT_FALSE(fs::exists(root_ + "/x.safetensors"));
}

}  // namespace
}  // namespace zo
