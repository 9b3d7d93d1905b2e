// TLS end to end: two zo-server processes serve TLS with a self-signed
// certificate made at test time and call each other over TLS; workers train
// through it and get the reference result; a plaintext client is refused
// promptly; zo-ctl reaches the servers with --tls-ca.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/cli/zo_ctl_runner.h"
#include "tests/server/least_squares.h"
#include "tests/server/server_process.h"
#include "tests/server/training_harness.h"

namespace zo::testing {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

constexpr char kToken[] = "tls-token";
constexpr int kSteps = 8;

const std::string kConfig = ReferenceJobConfig(R"("zo": {"chunk_elems": 128})");

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Two TLS servers (certificate for 127.0.0.1 and localhost, token required)
// that verify each other with the same self-signed certificate.
class TlsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (std::system("command -v openssl >/dev/null 2>&1") != 0) {
      GTEST_SKIP() << "the openssl CLI is not installed (deploy/install-deps.sh test installs it); "
                      "it makes the test certificate";
    }
    dir_ = absl::StrCat(::testing::TempDir(), "/zo_tls_", getpid(), "_",
                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    cert_ = dir_ + "/cert.pem";
    const std::string key = dir_ + "/key.pem";
    const std::string openssl = absl::StrCat(
        "openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=localhost "
        "-addext subjectAltName=IP:127.0.0.1,DNS:localhost -keyout ",
        key, " -out ", cert_, " >", dir_, "/openssl.log 2>&1");
    ASSERT_EQ(std::system(openssl.c_str()), 0) << ReadFile(dir_ + "/openssl.log");
    const std::string token_file = dir_ + "/token";
    std::ofstream(token_file) << kToken << "\n";
    for (int i = 0; i < 2; ++i) {
      ZO_ASSERT_OK_AND_ASSIGN(
          ServerProcess s, ServerProcess::Start({"--tls-cert", cert_, "--tls-key", key, "--tls-ca",
                                                 cert_, "--auth-token-file", token_file}));
      servers_.push_back(std::move(s));
    }
    options_.auth_token = kToken;
    options_.tls_root_certs = ReadFile(cert_);
  }
  void TearDown() override {
    servers_.clear();
    if (!dir_.empty()) fs::remove_all(dir_);
  }

  std::string dir_;
  std::string cert_;
  std::vector<ServerProcess> servers_;
  ClientOptions options_;
};

TEST_F(TlsTest, TrainingOverTlsMatchesTheReference) {
  const LeastSquares p = LeastSquares::Make({200, 333, 64}, 64, 2, 7);
  ZO_ASSERT_OK_AND_ASSIGN(
      auto workers, OpenWorkers(p, DType::kFloat32, "tls", kConfig, Addresses(servers_), options_));
  ASSERT_THAT(workers[0]->InitWeights(), IsOk());
  // Every step goes through the lead's peer calls (statistics, commit) to
  // the other server: TLS both ways.
  ASSERT_THAT(RunSteps(workers, 1, kSteps), IsOk());
  ZO_ASSERT_OK_AND_ASSIGN(const std::vector<float> x, workers[1]->PullAll(kSteps));

  Reference ref(p, {.clipping = 0.5});
  for (int s = 1; s <= kSteps; ++s) ref.Step(s, false, 1.0);
  double worst = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    worst = std::max(worst, std::abs(x[i] - ref.master()[i]) / (1 + std::abs(ref.master()[i])));
  }
  EXPECT_LT(worst, 1e-5);
  for (const ServerProcess& s : servers_) EXPECT_THAT(s.ReadLog(), HasSubstr(", TLS"));
}

TEST_F(TlsTest, APlaintextClientIsRefusedPromptly) {
  const LeastSquares p = LeastSquares::Make({100}, 8, 1, 3);
  ClientOptions plain = options_;
  plain.tls_root_certs.clear();
  plain.retry_for = absl::Milliseconds(300);
  plain.call_timeout = absl::Seconds(20);
  // UNAVAILABLE, not DEADLINE_EXCEEDED: the failed handshake ended the call
  // (and its 300 ms of retries) instead of it waiting for its deadline.
  EXPECT_THAT(
      OpenWorkers(p, DType::kFloat32, "plain", kConfig, Addresses(servers_), plain).status(),
      StatusIs(absl::StatusCode::kUnavailable, HasSubstr("127.0.0.1:")));
}

TEST_F(TlsTest, ZoCtlConnectsWithTheCa) {
  const LeastSquares p = LeastSquares::Make({100}, 8, 1, 3);
  ZO_ASSERT_OK_AND_ASSIGN(
      auto workers, OpenWorkers(p, DType::kFloat32, "ctl", kConfig, Addresses(servers_), options_));
  ASSERT_THAT(workers[0]->InitWeights(), IsOk());
  const std::string flags = absl::StrCat("status --json --server ", servers_[0].address(),
                                         " --job ctl --auth-token-file ", dir_, "/token");
  ZoCtlResult r = RunZoCtl(flags + " --tls-ca " + cert_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(nlohmann::json::parse(r.out)["num_servers"], 2);
  r = RunZoCtl(flags + " --timeout 5");  // plaintext against the TLS port
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("UNAVAILABLE"));
}

}  // namespace
}  // namespace zo::testing
