#include "ctl/message_json.h"

#include <cstdint>

#include "gtest/gtest.h"
#include "proto/zo/v1/job.pb.h"
#include "proto/zo/v1/tensor.pb.h"

namespace zo::ctl {
namespace {

TEST(MessageJsonTest, EveryFieldInOrderWithInt64AsANumber) {
  v1::JobStatus status;
  status.set_job("gpt2");
  status.set_version(int64_t{1} << 53);  // past int32, where protobuf's JSON quotes
  const nlohmann::ordered_json j = MessageToJson(status);
  EXPECT_EQ(j["job"], "gpt2");
  ASSERT_TRUE(j["version"].is_number_integer());
  EXPECT_EQ(j["version"].get<int64_t>(), int64_t{1} << 53);
  // Unset fields are there too, at their defaults.
  EXPECT_EQ(j.size(), static_cast<size_t>(v1::JobStatus::descriptor()->field_count()));
  EXPECT_EQ(j.begin().key(), v1::JobStatus::descriptor()->field(0)->name());
}

TEST(MessageJsonTest, RepeatedNestedAndEnums) {
  v1::Manifest manifest;
  v1::TensorSpec* t = manifest.add_tensors();
  t->set_name("wte");
  t->add_shape(50304);
  t->add_shape(768);
  t->set_dtype(v1::DTYPE_BF16);
  t->set_group(1);
  manifest.add_tensors()->set_name("scale");
  const nlohmann::ordered_json expected = nlohmann::ordered_json::parse(R"({"tensors": [
      {"name": "wte", "shape": [50304, 768], "dtype": "DTYPE_BF16", "group": 1},
      {"name": "scale", "shape": [], "dtype": "DTYPE_UNSPECIFIED", "group": 0}]})");
  EXPECT_EQ(MessageToJson(manifest), expected);
}

}  // namespace
}  // namespace zo::ctl
