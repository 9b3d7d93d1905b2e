// The Prometheus endpoints of a real zo-server and a real zo-train, scraped
// over HTTP while the worker trains: every family the dashboards use is
// there, and the counters move between two scrapes of a running job
// (docs/metrics.md).
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <regex>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/testing/http_get.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/cluster/wait_until.h"
#include "tests/server/server_process.h"
#include "tests/server/training_harness.h"
#include "tests/support/child_process.h"

namespace zo::testing {
namespace {

using ::testing::HasSubstr;

// The port in the "metrics at http://127.0.0.1:PORT/metrics" line of a log.
std::optional<int> MetricsPort(const std::string& log) {
  std::smatch m;
  static const std::regex kLine(R"(metrics at http://127\.0\.0\.1:(\d+)/metrics)");
  if (!std::regex_search(log, m, kLine)) return std::nullopt;
  return std::stoi(m[1].str());
}

std::string Scrape(int port) {
  absl::StatusOr<HttpResponse> r = HttpGet(port, "/metrics");
  EXPECT_THAT(r, IsOk());
  if (!r.ok()) return "";
  EXPECT_EQ(r->status, 200);
  return r->body;
}

double Value(const std::string& text, const std::string& name,
             const std::vector<std::string>& labels = {}) {
  absl::StatusOr<double> v = ScrapeValue(text, name, labels);
  EXPECT_THAT(v, IsOk()) << text;
  return v.ok() ? *v : -1;
}

// Scrapes until `name` reaches `at_least`, at most a minute: woken by the
// worker writing its log and metrics file in `dir` (a step went by), or by
// its end.
std::string ScrapeUntil(int port, const std::string& name, double at_least, const std::string& dir,
                        const ChildProcess& train) {
  std::string text;
  const absl::Status reached = cluster::WaitUntil(
      absl::StrCat(name, " >= ", at_least),
      [&] {
        text = Scrape(port);
        absl::StatusOr<double> v = ScrapeValue(text, name);
        return v.ok() && *v >= at_least;
      },
      dir, {&train}, std::chrono::minutes(1));
  EXPECT_THAT(reached, IsOk());
  return text;
}

TEST(MetricsScrapeTest, ServerAndWorkerCountersMoveWhileTraining) {
  const std::string dir = FreshTempDir("metrics_scrape");
  const std::string nvme = dir + "/nvme";
  std::filesystem::create_directories(nvme);
  // All optimizer state on NVMe, so the swap's counters move too.
  absl::StatusOr<ServerProcess> server = ServerProcess::Start(
      {"--metrics-listen", "127.0.0.1:0", "--memory-budget", "0", "--nvme-path", nvme});
  ASSERT_THAT(server, IsOk());
  const std::optional<int> server_port = MetricsPort(server->ReadLog());
  ASSERT_TRUE(server_port.has_value()) << server->ReadLog();

  // A low loss scale: no step in the watched window may be skipped for an
  // overflow (a skipped step moves no weights, bytes or NVMe state).
  const std::string config = dir + "/ds_config.json";
  std::ofstream(config) << R"({"train_micro_batch_size_per_gpu": 8,
    "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
    "fp16": {"enabled": true, "initial_scale_power": 4},
    "zero_optimization": {"sub_group_size": 20000,
                          "offload_optimizer": {"device": "nvme", "nvme_path": ")"
                        << nvme << R"("}}})";
  absl::StatusOr<ChildProcess> train = ChildProcess::Start(
      {ZO_TRAIN_PATH, "--model", "mlp", "--mlp-width", "64", "--mlp-depth", "2", "--steps",
       "100000", "--config", config, "--servers", server->address(), "--job", "scraped",
       "--metrics-listen", "127.0.0.1:0", "--metrics-out", dir + "/train.jsonl"},
      dir + "/train.log");
  ASSERT_THAT(train, IsOk());
  // The endpoint is up before the first step.
  std::optional<int> train_port;
  ASSERT_THAT(cluster::WaitUntil(
                  "zo-train's metrics line",
                  [&] { return (train_port = MetricsPort(train->ReadLog())).has_value(); }, dir,
                  {&*train}, std::chrono::seconds(30)),
              IsOk())
      << train->ReadLog();

  const std::string w1 = ScrapeUntil(*train_port, "zo_train_steps_total", 2, dir, *train);
  const std::string s1 = Scrape(*server_port);
  const double steps1 = Value(w1, "zo_train_steps_total");
  ASSERT_GE(steps1, 2) << train->ReadLog();
  const std::string w2 = ScrapeUntil(*train_port, "zo_train_steps_total", steps1 + 3, dir, *train);
  // The server's own count: it may be ahead of the worker's at s1 (the
  // worker counts a step once it has reported it).
  const std::string s2 =
      ScrapeUntil(*server_port, "zo_server_job_steps_total",
                  Value(s1, "zo_server_job_steps_total", {"zo_job=\"scraped\""}) + 2, dir, *train);
  train->Kill();

  // The worker: its own counters, labelled with the job.
  const std::vector<std::string> job = {"zo_job=\"scraped\""};
  EXPECT_GT(Value(w2, "zo_train_steps_total", job), steps1);
  for (const char* phase : {"compute", "other"}) {
    const std::vector<std::string> l = {"zo_job=\"scraped\"",
                                        absl::StrCat("phase=\"", phase, "\"")};
    EXPECT_GT(Value(w2, "zo_train_step_seconds_total", l),
              Value(w1, "zo_train_step_seconds_total", l))
        << phase;
  }
  for (const char* dir : {"out", "in"}) {
    const std::vector<std::string> l = {absl::StrCat("direction=\"", dir, "\"")};
    EXPECT_GT(Value(w2, "zo_train_bytes_total", l), Value(w1, "zo_train_bytes_total", l)) << dir;
  }
  EXPECT_GT(Value(w2, "zo_train_samples_total"), Value(w1, "zo_train_samples_total"));
  EXPECT_GT(Value(w2, "zo_train_loss"), 0);
  EXPECT_GT(Value(w2, "zo_train_loss_scale"), 0);

  // The server: the same job's step split, bytes, optimizer numbers, NVMe.
  EXPECT_EQ(Value(s2, "zo_server_jobs"), 1);
  EXPECT_GT(Value(s2, "zo_server_job_steps_total", job),
            Value(s1, "zo_server_job_steps_total", job));
  EXPECT_GT(Value(s2, "zo_server_job_version", job), Value(s1, "zo_server_job_version", job));
  for (const char* phase : {"wait_gradients", "update", "serve_pulls"}) {
    const std::vector<std::string> l = {absl::StrCat("phase=\"", phase, "\"")};
    EXPECT_GT(Value(s2, "zo_server_job_step_seconds_total", l),
              Value(s1, "zo_server_job_step_seconds_total", l))
        << phase;
  }
  for (const char* dir : {"in", "out"}) {
    const std::vector<std::string> l = {absl::StrCat("direction=\"", dir, "\"")};
    EXPECT_GT(Value(s2, "zo_server_job_bytes_total", l), Value(s1, "zo_server_job_bytes_total", l))
        << dir;
  }
  EXPECT_GT(Value(s2, "zo_server_job_lr", job), 0);
  EXPECT_GT(Value(s2, "zo_server_job_grad_norm", job), 0);
  EXPECT_GT(Value(s2, "zo_server_job_loss_scale", job), 1);
  EXPECT_EQ(Value(s2, "zo_server_job_healthy", job), 1);
  // Its state is on NVMe: no speculative update, and the counters say so.
  for (const char* outcome : {"kept", "redone"}) {
    EXPECT_EQ(Value(s2, "zo_server_job_speculated_chunks_total",
                    {absl::StrCat("outcome=\"", outcome, "\"")}),
              0)
        << outcome;
  }
  EXPECT_GT(Value(s2, "zo_server_job_resident_bytes", {"tier=\"nvme\""}), 0);
  EXPECT_GT(Value(s2, "zo_server_job_resident_bytes", {"tier=\"ram\""}), 0);
  for (const char* op : {"read", "write"}) {
    const std::vector<std::string> l = {absl::StrCat("op=\"", op, "\"")};
    EXPECT_GT(Value(s2, "zo_server_nvme_bytes_total", l),
              Value(s1, "zo_server_nvme_bytes_total", l))
        << op;
    EXPECT_GT(Value(s2, "zo_server_nvme_request_seconds_total", l), 0) << op;
  }
  EXPECT_GT(Value(s2, "zo_server_rpcs_total", {"method=\"PushGradients\"", "code=\"OK\""}),
            Value(s1, "zo_server_rpcs_total", {"method=\"PushGradients\"", "code=\"OK\""}));

  // An error is counted by its code: a status of a job that does not exist.
  const std::string before = Scrape(*server_port);
  EXPECT_THAT(ScrapeValue(before, "zo_server_rpcs_total",
                          {"method=\"GetJobStatus\"", "code=\"NOT_FOUND\""}),
              StatusIs(absl::StatusCode::kNotFound, ::testing::_));
  const int ctl = std::system(absl::StrCat(ZO_CTL_PATH, " status --server ", server->address(),
                                           " --job no-such-job > /dev/null 2>&1")
                                  .c_str());
  EXPECT_NE(ctl, 0);
  EXPECT_EQ(Value(Scrape(*server_port), "zo_server_rpcs_total",
                  {"method=\"GetJobStatus\"", "code=\"NOT_FOUND\""}),
            1);
  EXPECT_EQ(server->Stop(), 0);
}

}  // namespace
}  // namespace zo::testing
