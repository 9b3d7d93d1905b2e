// `zo-ctl status` and `zo-ctl checkpoint`: the real binary against no server,
// and against a stand-in Offload service on a loopback port that answers the
// two calls and checks the auth token.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "proto/rpc_util.h"
#include "proto/zo/v1/offload_service.grpc.pb.h"
#include "tests/cli/zo_ctl_runner.h"

namespace zo {
namespace {

using ::testing::HasSubstr;
using ::zo::testing::RunZoCtl;
using ::zo::testing::ZoCtlResult;

constexpr char kToken[] = "s3cret";

// Knows one job, "gpt"; wants `authorization: Bearer s3cret`.
class FakeOffload final : public zo::v1::Offload::Service {
 public:
  grpc::Status GetJobStatus(grpc::ServerContext* context,
                            const zo::v1::GetJobStatusRequest* request,
                            zo::v1::JobStatus* status) override {
    if (grpc::Status auth = CheckAuth(*context); !auth.ok()) return auth;
    if (request->job() != "gpt") {
      return grpc::Status(grpc::StatusCode::NOT_FOUND, "no job '" + request->job() + "'");
    }
    status->set_job("gpt");
    status->set_version(120);
    status->set_open_step(121);
    status->set_applied_steps(118);
    status->set_loss_scale(65536);
    status->set_server_index(1);
    status->set_num_servers(2);
    status->set_dp_world_size(4);
    status->set_total_elems(124439808);
    status->set_local_elems(62219904);
    status->set_last_grad_norm(0.5);
    status->set_last_lr(6e-4);
    status->set_last_checkpoint_step(100);
    return grpc::Status::OK;
  }

  grpc::Status Checkpoint(grpc::ServerContext* context, const zo::v1::CheckpointRequest* request,
                          zo::v1::CheckpointResponse* response) override {
    if (grpc::Status auth = CheckAuth(*context); !auth.ok()) return auth;
    response->set_path("/ckpt/" + request->job() + "/step-00000120");
    response->set_version(120);
    return grpc::Status::OK;
  }

 private:
  static grpc::Status CheckAuth(const grpc::ServerContext& context) {
    const auto& metadata = context.client_metadata();
    const auto it = metadata.find(kAuthMetadataKey);
    if (it == metadata.end() ||
        std::string(it->second.data(), it->second.size()) != BearerValue(kToken)) {
      return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "missing or wrong token");
    }
    return grpc::Status::OK;
  }
};

class ZoCtlRpcTest : public ::testing::Test {
 protected:
  void SetUp() override {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    builder.RegisterService(&service_);
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    ASSERT_GT(port_, 0);
    token_file_ = std::filesystem::temp_directory_path().string() + "/zo_ctl_rpc_token_" +
                  std::to_string(getpid());
    std::ofstream(token_file_) << kToken << "\n";
  }
  void TearDown() override {
    server_->Shutdown();
    std::filesystem::remove(token_file_);
  }
  std::string Flags(const std::string& job) const {
    return absl::StrCat("--server 127.0.0.1:", port_, " --job ", job, " --auth-token-file ",
                        token_file_);
  }

  FakeOffload service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  std::string token_file_;
};

TEST(ZoCtlNoServerTest, StatusSaysWhereNoServerRuns) {
  for (const char* command : {"status", "checkpoint"}) {
    const ZoCtlResult r = RunZoCtl(absl::StrCat(command, " --server 127.0.0.1:1 --job x"));
    EXPECT_EQ(r.exit_code, 1) << r.err;
    EXPECT_THAT(r.err, HasSubstr("UNAVAILABLE"));
    EXPECT_THAT(r.err, HasSubstr("is zo-server running at 127.0.0.1:1?"));
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << "one line: " << r.err;
    EXPECT_EQ(r.out, "");
  }
}

TEST(ZoCtlNoServerTest, MissingFlagsExitTwo) {
  ZoCtlResult r = RunZoCtl("status --job x");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("--server HOST:PORT"));
  r = RunZoCtl("checkpoint --server 127.0.0.1:1 --job x --auth-token-file /nonexistent/token");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("/nonexistent/token"));
}

TEST_F(ZoCtlRpcTest, StatusPrintsTheJobReadably) {
  const ZoCtlResult r = RunZoCtl("status " + Flags("gpt"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr(absl::StrCat("job gpt on server 1 of 2 (127.0.0.1:", port_, ")")));
  EXPECT_THAT(r.out, HasSubstr("120 (gradients are pushed for step 121)"));
  EXPECT_THAT(r.out, HasSubstr("health           ok"));
  EXPECT_THAT(r.out, HasSubstr("last checkpoint  step 100"));
}

TEST_F(ZoCtlRpcTest, StatusAsJsonHasEveryField) {
  const ZoCtlResult r = RunZoCtl("status --json " + Flags("gpt"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["job"], "gpt");
  EXPECT_EQ(j["version"], 120);
  EXPECT_EQ(j["total_elems"], 124439808);
  EXPECT_EQ(j["loss_scale"], 65536.0);
  EXPECT_EQ(j["last_skipped"], false);
  EXPECT_EQ(j["needs_restore"], "");
  EXPECT_EQ(j.size(), static_cast<size_t>(zo::v1::JobStatus::descriptor()->field_count()));
}

TEST_F(ZoCtlRpcTest, CheckpointPrintsThePathAndVersion) {
  const ZoCtlResult r = RunZoCtl("checkpoint " + Flags("gpt"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "checkpoint of job gpt committed: version 120 at /ckpt/gpt/step-00000120\n");
}

TEST_F(ZoCtlRpcTest, ServerErrorsExitOneWithTheirCode) {
  ZoCtlResult r = RunZoCtl("status " + Flags("nope"));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("NOT_FOUND: no job 'nope'"));
  r = RunZoCtl(absl::StrCat("status --server 127.0.0.1:", port_, " --job gpt"));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("UNAUTHENTICATED"));
  EXPECT_THAT(r.err, HasSubstr("--auth-token-file"));
}

}  // namespace
}  // namespace zo
