#include "rpc/proto_convert.h"

#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace zo {
namespace {

using ::testing::HasSubstr;
using testing::StatusIs;

TEST(ProtoConvertTest, DTypesMapToTheirWireNames) {
  EXPECT_EQ(DTypeToProto(DType::kFloat32), v1::DTYPE_FP32);
  EXPECT_EQ(DTypeToProto(DType::kFloat16), v1::DTYPE_FP16);
  EXPECT_EQ(DTypeToProto(DType::kBFloat16), v1::DTYPE_BF16);
  for (DType d : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
    ZO_ASSERT_OK_AND_ASSIGN(DType back, DTypeFromProto(DTypeToProto(d)));
    EXPECT_EQ(back, d);
  }
}

TEST(ProtoConvertTest, UnknownWireDTypesAreInvalid) {
  EXPECT_THAT(
      DTypeFromProto(v1::DTYPE_UNSPECIFIED),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("dtype 0 is not fp32, fp16 or bf16")));
  EXPECT_THAT(DTypeFromProto(static_cast<v1::DType>(42)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("dtype 42")));
}

TEST(ProtoConvertTest, ManifestKeepsOrderNamesShapesAndDTypes) {
  const v1::Manifest m = ManifestToProto({
      {.name = "wte", .shape = {50304, 768}, .dtype = DType::kBFloat16},
      {.name = "scale", .shape = {}, .dtype = DType::kBFloat16},
  });
  ASSERT_EQ(m.tensors_size(), 2);
  EXPECT_EQ(m.tensors(0).name(), "wte");
  EXPECT_THAT(m.tensors(0).shape(), ::testing::ElementsAre(50304, 768));
  EXPECT_EQ(m.tensors(0).dtype(), v1::DTYPE_BF16);
  EXPECT_EQ(m.tensors(1).name(), "scale");
  EXPECT_EQ(m.tensors(1).shape_size(), 0);
}

}  // namespace
}  // namespace zo
