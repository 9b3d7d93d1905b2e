// The generated code links and the wire encoding round-trips; the service
// itself is tested with the server.
#include <string>

#include "gtest/gtest.h"
#include "proto/zo/v1/offload_service.grpc.pb.h"
#include "proto/zo/v1/tensor.pb.h"

namespace zo {
namespace {

TEST(ProtoTest, ManifestRoundTripsThroughTheWireFormat) {
  v1::Manifest manifest;
  v1::TensorSpec* t = manifest.add_tensors();
  t->set_name("blocks.0.mlp.fc.weight");
  t->add_shape(3072);
  t->add_shape(768);
  t->set_dtype(v1::DTYPE_BF16);
  manifest.add_tensors()->set_name("scalar");

  std::string bytes;
  ASSERT_TRUE(manifest.SerializeToString(&bytes));
  v1::Manifest parsed;
  ASSERT_TRUE(parsed.ParseFromString(bytes));
  ASSERT_EQ(parsed.tensors_size(), 2);
  EXPECT_EQ(parsed.tensors(0).name(), "blocks.0.mlp.fc.weight");
  EXPECT_EQ(parsed.tensors(0).shape(1), 768);
  EXPECT_EQ(parsed.tensors(0).dtype(), v1::DTYPE_BF16);
  EXPECT_EQ(parsed.tensors(1).shape_size(), 0);
  EXPECT_EQ(parsed.tensors(1).dtype(), v1::DTYPE_UNSPECIFIED);
}

TEST(ProtoTest, TruncatedBytesDoNotParse) {
  v1::Manifest manifest;
  manifest.add_tensors()->set_name(std::string(300, 'x'));
  std::string bytes;
  ASSERT_TRUE(manifest.SerializeToString(&bytes));
  bytes.resize(bytes.size() / 2);
  v1::Manifest parsed;
  EXPECT_FALSE(parsed.ParseFromString(bytes));
}

}  // namespace
}  // namespace zo
