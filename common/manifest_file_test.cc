#include "common/manifest_file.h"

#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace zo {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using testing::StatusIs;

TEST(ManifestFileTest, ParsesTensorsInOrder) {
  ZO_ASSERT_OK_AND_ASSIGN(auto specs, ParseManifestJson(R"({"tensors": [
      {"name": "wte", "shape": [65, 128]},
      {"name": "ln.bias", "shape": [128], "dtype": "bfloat16"},
      {"name": "step", "shape": []}]})"));
  ASSERT_EQ(specs.size(), 3u);
  EXPECT_EQ(specs[0].name, "wte");
  EXPECT_THAT(specs[0].shape, ElementsAre(65, 128));
  EXPECT_EQ(specs[0].dtype, DType::kFloat16);
  EXPECT_EQ(specs[1].dtype, DType::kBFloat16);
  EXPECT_THAT(specs[2].shape, ElementsAre());
}

TEST(ManifestFileTest, ErrorsNameTheTensorAndField) {
  EXPECT_THAT(ParseManifestJson("{"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("not valid JSON")));
  EXPECT_THAT(ParseManifestJson(R"({"tensor": []})"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("\"tensors\" array")));
  EXPECT_THAT(ParseManifestJson(R"({"tensors": [{"name": "a", "shape": [1]}, {"shape": [1]}]})"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("tensors[1]: \"name\"")));
  EXPECT_THAT(ParseManifestJson(R"({"tensors": [{"name": "a", "shape": [2.5]}]})"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("'a': shape entry 2.5")));
  EXPECT_THAT(ParseManifestJson(R"({"tensors": [{"name": "a", "shape": [1], "dtype": "int8"}]})"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("dtype \"int8\"")));
  EXPECT_THAT(LoadManifestFile("/nonexistent/m.json"),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("/nonexistent/m.json")));
}

// Found by fuzz/manifest_file_fuzzer.cc: zo-ctl estimate multiplied the
// shape of [1111111111111111024, 768] (signed overflow).
TEST(ManifestFileTest, ShapesWhoseProductOverflowsAreRefused) {
  EXPECT_THAT(
      ParseManifestJson(R"({"tensors": [{"name": "wpe", "shape": [1111111111111111024, 768]}]})"),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("'wpe': more than 2^62 elements")));
  // Past a zero the count stays 0, but the other dimensions still multiply.
  EXPECT_THAT(
      ParseManifestJson(R"({"tensors": [{"name": "e", "shape": [0, 4294967296, 4294967296]}]})"),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("'e': more than 2^62")));
  EXPECT_THAT(
      ParseManifestJson(R"({"tensors": [{"name": "n", "shape": [-3]}]})"),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("'n': shape entry -3 is negative")));
  EXPECT_THAT(ParseManifestJson(R"({"tensors": [{"name": "u", "shape": [18446744073709551615]}]})"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("is negative")));
  ZO_ASSERT_OK_AND_ASSIGN(auto specs, ParseManifestJson(R"({"tensors": [
      {"name": "big", "shape": [4611686018427387904]}, {"name": "empty", "shape": [0, 768]}]})"));
  EXPECT_THAT(specs[0].shape, ElementsAre(int64_t{1} << 62));
}

}  // namespace
}  // namespace zo
