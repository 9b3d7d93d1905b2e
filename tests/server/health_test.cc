// The standard services of a real zo-server process, called the way generic
// tools (grpc_health_probe, grpcurl) call them: no generated code, the
// protobuf bytes written and read by hand, and no token, although the server
// requires one for zo.v1 (README: probes need no secret). Then a graceful
// SIGTERM.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "tests/server/server_process.h"

namespace zo::testing {
namespace {

using ::testing::Contains;
using ::testing::HasSubstr;

grpc::ByteBuffer ToBuffer(const std::string& bytes) {
  grpc::Slice slice(bytes);
  return grpc::ByteBuffer(&slice, 1);
}

std::string FromBuffer(const grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  if (!buffer.Dump(&slices).ok()) return "";
  std::string out;
  for (const grpc::Slice& s : slices) {
    out.append(reinterpret_cast<const char*>(s.begin()), s.size());
  }
  return out;
}

// Protobuf wire format, just enough to read the replies: the payloads of
// the length-delimited fields numbered `field` at the top level of `bytes`.
// Other fields are skipped; malformed input ends the scan.
std::vector<std::string> LengthDelimited(const std::string& bytes, uint32_t field) {
  std::vector<std::string> out;
  size_t i = 0;
  auto varint = [&](uint64_t& v) {
    v = 0;
    for (int shift = 0; i < bytes.size() && shift < 64; shift += 7) {
      const uint8_t b = static_cast<uint8_t>(bytes[i++]);
      v |= static_cast<uint64_t>(b & 0x7f) << shift;
      if ((b & 0x80) == 0) return true;
    }
    return false;
  };
  uint64_t key = 0, n = 0;
  while (i < bytes.size() && varint(key)) {
    switch (key & 7) {
      case 0:
        if (!varint(n)) return out;
        break;
      case 1:
        i += 8;
        break;
      case 5:
        i += 4;
        break;
      case 2:
        if (!varint(n) || n > bytes.size() - i) return out;
        if ((key >> 3) == field) out.push_back(bytes.substr(i, n));
        i += n;
        break;
      default:
        return out;
    }
  }
  return out;
}

// Waits for the next event on `cq`, which must be `tag`; its ok flag.
bool Await(grpc::CompletionQueue& cq, int tag) {
  void* got = nullptr;
  bool ok = false;
  const auto deadline = absl::ToChronoTime(absl::Now() + absl::Seconds(10));
  if (cq.AsyncNext(&got, &ok, deadline) != grpc::CompletionQueue::GOT_EVENT) {
    ADD_FAILURE() << "no completion for tag " << tag;
    return false;
  }
  EXPECT_EQ(got, reinterpret_cast<void*>(static_cast<intptr_t>(tag)));
  return ok;
}

void* Tag(int tag) { return reinterpret_cast<void*>(static_cast<intptr_t>(tag)); }

class HealthTest : public ::testing::Test {
 protected:
  void SetUp() override {
    token_file_ = absl::StrCat(::testing::TempDir(), "/zo_health_token_", getpid());
    std::ofstream(token_file_) << "health-test-token\n";
    ZO_ASSERT_OK_AND_ASSIGN(server_, ServerProcess::Start({"--auth-token-file", token_file_}));
    stub_ = std::make_unique<grpc::GenericStub>(
        grpc::CreateChannel(server_->address(), grpc::InsecureChannelCredentials()));
  }
  void TearDown() override {
    cq_.Shutdown();
    void* tag;
    bool ok;
    while (cq_.Next(&tag, &ok)) {
    }
    std::remove(token_file_.c_str());
  }

  std::unique_ptr<grpc::ClientContext> Context() {
    auto context = std::make_unique<grpc::ClientContext>();
    context->set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    return context;
  }

  // One unary call of `method` with the serialised `request`, no token; the
  // reply's bytes land in `response`.
  grpc::Status UnaryCall(const std::string& method, const std::string& request,
                         std::string* response) {
    auto context = Context();
    auto call = stub_->PrepareUnaryCall(context.get(), method, ToBuffer(request), &cq_);
    call->StartCall();
    grpc::ByteBuffer reply;
    grpc::Status status;
    call->Finish(&reply, &status, Tag(1));
    if (!Await(cq_, 1)) return grpc::Status(grpc::StatusCode::UNKNOWN, "the call did not finish");
    *response = FromBuffer(reply);
    return status;
  }

  std::string token_file_;
  std::optional<ServerProcess> server_;
  std::unique_ptr<grpc::GenericStub> stub_;
  grpc::CompletionQueue cq_;
};

TEST_F(HealthTest, HealthReflectionAndAGracefulStop) {
  std::string response;
  {  // The token is in force: zo.v1 without it is refused.
    const grpc::Status status =
        UnaryCall("/zo.v1.Offload/GetServerInfo", "", &response);  // GetServerInfoRequest{}
    EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAUTHENTICATED) << status.error_message();
  }
  {  // grpc.health.v1.Health/Check, service "" (the server as a whole)
    const grpc::Status status =
        UnaryCall("/grpc.health.v1.Health/Check", "", &response);  // HealthCheckRequest{}
    ASSERT_TRUE(status.ok()) << status.error_code() << ": " << status.error_message();
    // HealthCheckResponse{status: SERVING}: field 1, varint 1.
    EXPECT_EQ(response, std::string("\x08\x01", 2));
  }
  {  // grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo, list_services
    auto context = Context();
    auto stream = stub_->PrepareCall(
        context.get(), "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", &cq_);
    stream->StartCall(Tag(1));
    ASSERT_TRUE(Await(cq_, 1));
    // ServerReflectionRequest{list_services: ""}: field 7, length 0.
    stream->Write(ToBuffer(std::string("\x3a\x00", 2)), Tag(2));
    ASSERT_TRUE(Await(cq_, 2));
    grpc::ByteBuffer response;
    stream->Read(&response, Tag(3));
    ASSERT_TRUE(Await(cq_, 3));
    stream->WritesDone(Tag(4));
    ASSERT_TRUE(Await(cq_, 4));
    grpc::Status status;
    stream->Finish(&status, Tag(5));
    ASSERT_TRUE(Await(cq_, 5));
    ASSERT_TRUE(status.ok()) << status.error_code() << ": " << status.error_message();
    // ServerReflectionResponse.list_services_response (6) -> ListServiceResponse
    // .service (1, repeated) -> ServiceResponse.name (1).
    const std::vector<std::string> lists = LengthDelimited(FromBuffer(response), 6);
    ASSERT_EQ(lists.size(), 1u) << "no list_services_response";
    std::vector<std::string> names;
    for (const std::string& service : LengthDelimited(lists[0], 1)) {
      for (const std::string& name : LengthDelimited(service, 1)) names.push_back(name);
    }
    EXPECT_THAT(names, Contains("zo.v1.Offload"));
    EXPECT_THAT(names, Contains("grpc.health.v1.Health"));
    EXPECT_THAT(names, Contains("grpc.reflection.v1alpha.ServerReflection"));
  }
  // SIGTERM with this client still connected: a clean exit (code 0), not a
  // hang on the idle connection (which the test's timeout would catch).
  EXPECT_EQ(server_->Stop(), 0) << server_->ReadLog();
  EXPECT_THAT(server_->ReadLog(), HasSubstr("shutting down"));
}

}  // namespace
}  // namespace zo::testing
