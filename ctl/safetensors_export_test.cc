#include "ctl/safetensors_export.h"

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "offload/checkpoint/checkpoint_test_util.h"

namespace zo {
namespace {

namespace fs = std::filesystem;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::zo::testing::FlatState;
using ::zo::testing::FlipByte;
using ::zo::testing::FreshTestDir;
using ::zo::testing::IsOk;
using ::zo::testing::MakeFlatState;
using ::zo::testing::StatusIs;
using ::zo::testing::WriteTestCheckpoint;

// Five tensors over chunks of 20000 on 2 servers; a scalar and a tensor that
// spans three chunks (and both parts) among them.
FlatState TestState() {
  return MakeFlatState({{"model.embed.weight", {300, 100}, DType::kFloat16},
                        {"model.layers.0.w", {20011}, DType::kBFloat16},
                        {"model.layers.0.b", {}, DType::kFloat32},
                        {"model.layers.1.w", {7, 1000}, DType::kFloat16},
                        {"lm_head.weight", {30000, 1}, DType::kFloat16}},
                       /*chunk_elems=*/20000, /*num_servers=*/2, /*seed=*/11);
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// Parses the file as a safetensors reader would, with nothing from the
// exporter, and checks it holds `s`'s master weights bit for bit.
void ExpectSafetensorsOf(const std::string& path, const FlatState& s, int64_t version) {
  const std::string bytes = ReadAll(path);
  ASSERT_GE(bytes.size(), 8u);
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);  // little-endian host
  ASSERT_LE(8 + n, bytes.size());
  EXPECT_EQ(n % 8, 0u);
  const std::string text = bytes.substr(8, n);
  const nlohmann::json header = nlohmann::json::parse(text);
  EXPECT_EQ(header.dump().size(), text.find_last_not_of(' ') + 1) << "only spaces pad the JSON";
  const char* data = bytes.data() + 8 + n;
  const uint64_t data_bytes = bytes.size() - 8 - n;

  ASSERT_EQ(header.size(), s.manifest.size() + 1);
  const nlohmann::json& meta = header.at("__metadata__");
  EXPECT_EQ(meta.at("format"), "pt");
  EXPECT_EQ(meta.at("zo_version"), absl::StrCat(version));
  EXPECT_EQ(meta.at("zo_step"), absl::StrCat(version - 1));  // TestMeta's applied_steps
  EXPECT_EQ(meta.at("zo_job"), "gpt");
  uint64_t expected_begin = 0;
  for (const TensorSpec& t : s.manifest) {
    SCOPED_TRACE(t.name);
    ASSERT_TRUE(header.contains(t.name));
    const nlohmann::json& e = header.at(t.name);
    EXPECT_EQ(e.at("dtype"), "F32");
    EXPECT_EQ(e.at("shape").get<std::vector<int64_t>>(), t.shape);
    const uint64_t begin = e.at("data_offsets")[0].get<uint64_t>();
    const uint64_t end = e.at("data_offsets")[1].get<uint64_t>();
    EXPECT_EQ(begin, expected_begin) << "offsets are contiguous, in manifest order";
    ASSERT_EQ(end - begin, static_cast<uint64_t>(NumElements(t.shape)) * 4);
    ASSERT_LE(end, data_bytes);
    EXPECT_EQ(std::memcmp(data + begin, s.master.data() + begin / 4, end - begin), 0);
    expected_begin = end;
  }
  EXPECT_EQ(expected_begin, data_bytes) << "the data ends with the last tensor";
}

class SafetensorsExportTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = FreshTestDir(::testing::UnitTest::GetInstance()->current_test_info()->name());
  }
  void TearDown() override { fs::remove_all(root_); }
  std::string root_;
};

TEST_F(SafetensorsExportTest, WritesEveryTensorsMasterWeights) {
  const FlatState s = TestState();
  ZO_ASSERT_OK_AND_ASSIGN(const std::string dir, WriteTestCheckpoint(root_, "gpt", 12, s));
  const std::string out = root_ + "/model.safetensors";
  ASSERT_THAT(ExportMasterToSafetensors(dir, out), IsOk());
  EXPECT_FALSE(fs::exists(out + ".tmp"));
  ExpectSafetensorsOf(out, s, 12);
}

TEST_F(SafetensorsExportTest, ASmallBufferGivesTheSameFile) {
  const FlatState s = TestState();
  ZO_ASSERT_OK_AND_ASSIGN(const std::string dir, WriteTestCheckpoint(root_, "gpt", 3, s));
  const std::string big = root_ + "/big.safetensors", small = root_ + "/small.safetensors";
  std::vector<std::string> progress;
  SafetensorsExportOptions options;
  options.buffer_elems = 999;  // many reads per tensor, crossing chunks and blocks
  options.progress = [&](int64_t t, const std::string& name) {
    EXPECT_EQ(t, static_cast<int64_t>(progress.size()));
    progress.push_back(name);
  };
  ZO_ASSERT_OK_AND_ASSIGN(const SafetensorsExportSummary summary,
                          ExportMasterToSafetensors(dir, small, options));
  ASSERT_THAT(ExportMasterToSafetensors(dir, big), IsOk());
  EXPECT_EQ(summary.tensors, 5);
  EXPECT_EQ(summary.bytes, static_cast<int64_t>(fs::file_size(small)));
  EXPECT_EQ(progress,
            (std::vector<std::string>{"model.embed.weight", "model.layers.0.w", "model.layers.0.b",
                                      "model.layers.1.w", "lm_head.weight"}));
  EXPECT_EQ(ReadAll(small), ReadAll(big));
  ExpectSafetensorsOf(small, s, 3);
}

TEST_F(SafetensorsExportTest, ACorruptPartIsDataLossAndLeavesNoFile) {
  const FlatState s = TestState();
  ZO_ASSERT_OK_AND_ASSIGN(const std::string dir, WriteTestCheckpoint(root_, "gpt", 3, s));
  // Chunk 1 (flat [20000, 40000)) is part 1's first chunk; its master starts
  // after the 4 KiB header. Element 17000 (flat 37000) is in its second
  // 64 KiB block, which only "model.layers.0.w" (flat [30000, 50011))
  // touches: the first tensor is written before the error.
  ASSERT_THAT(FlipByte(dir + "/part-00001.zop", 4096 + 4 * 17000), IsOk());
  const std::string out = root_ + "/model.safetensors";
  EXPECT_THAT(ExportMasterToSafetensors(dir, out),
              StatusIs(absl::StatusCode::kDataLoss,
                       AllOf(HasSubstr("model.layers.0.w"), HasSubstr("part-00001.zop"),
                             HasSubstr("chunk 1"))));
  EXPECT_FALSE(fs::exists(out));
  EXPECT_FALSE(fs::exists(out + ".tmp"));
}

TEST_F(SafetensorsExportTest, AMissingCheckpointIsNotFoundAndLeavesNoFile) {
  const std::string out = root_ + "/model.safetensors";
  EXPECT_THAT(ExportMasterToSafetensors(root_ + "/nope", out),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr(root_ + "/nope")));
  EXPECT_FALSE(fs::exists(out));
  EXPECT_FALSE(fs::exists(out + ".tmp"));
}

}  // namespace
}  // namespace zo
