// The fixture of the Job tests (job_test.cc, job_param_groups_test.cc): a
// job on one server over kElems elements in chunks of 64, opened from a
// config body, with helpers to push a step, pull a version and wait for one.
#ifndef ZO_SERVER_JOB_TEST_FIXTURE_H_
#define ZO_SERVER_JOB_TEST_FIXTURE_H_

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/fp16.h"
#include "common/status_macros.h"
#include "common/testing/status_matchers.h"
#include "gtest/gtest.h"
#include "offload/checkpoint/checkpoint_test_util.h"
#include "offload/thread_pool.h"
#include "rpc/proto_convert.h"
#include "server/gradient_piece_view.h"
#include "server/job.h"

namespace zo {

inline constexpr int64_t kElems = 100;  // two chunks of 64 and 36

class JobTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = testing::FreshTestDir(::testing::UnitTest::GetInstance()->current_test_info()->name());
  }
  void TearDown() override { std::filesystem::remove_all(root_); }

  // A job over tensors_ (one tensor of kElems elements by default), in
  // chunks of 64.
  std::unique_ptr<Job> Open(const std::string& config_body, v1::DType dtype = v1::DTYPE_FP32,
                            int dp = 1) {
    absl::StatusOr<std::unique_ptr<Job>> job = TryOpen(config_body, dtype, dp);
    EXPECT_THAT(job.status(), testing::IsOk());
    return job.ok() ? *std::move(job) : nullptr;
  }
  absl::StatusOr<std::unique_ptr<Job>> TryOpen(const std::string& config_body,
                                               v1::DType dtype = v1::DTYPE_FP32, int dp = 1,
                                               int micro_batches = 1) {
    v1::OpenJobRequest r;
    r.set_job("job");
    for (size_t i = 0; i < tensors_.size(); ++i) {
      v1::TensorSpec* t = r.mutable_manifest()->add_tensors();
      t->set_name(tensors_.size() == 1 ? "w" : absl::StrCat("w", i));
      t->add_shape(tensors_[i].first);
      t->set_dtype(dtype);
      t->set_group(tensors_[i].second);
    }
    // Bodies with a "zo" section set chunk_elems themselves.
    const bool has_zo = config_body.find("\"zo\"") != std::string::npos;
    r.set_config_json(absl::StrCat(R"({"train_batch_size": )", dp * micro_batches,
                                   R"(, "train_micro_batch_size_per_gpu": 1)",
                                   has_zo ? "" : R"(, "zo": {"chunk_elems": 64})",
                                   config_body.empty() ? "" : ", ", config_body, "}"));
    r.set_dp_world_size(dp);
    r.set_init_fingerprint(init_fingerprint_);
    r.add_servers("127.0.0.1:1");
    ZO_ASSIGN_OR_RETURN(JobSpec spec, JobSpecFromRequest(r));
    JobResources resources = Resources();
    resources.keep_checkpoints = keep_checkpoints_;
    resources.available_ram = available_ram_;
    resources.ram_budget_bytes = ram_budget_bytes_;
    resources.nvme_latency = nvme_latency_;
    resources.speculated = speculated_;
    resources.applying = applying_;
    resources.committing = committing_;
    return Job::Create(std::move(spec), resources);
  }
  // What Open lends a job, for a JobRegistry of the test's own.
  JobResources Resources() {
    JobResources resources;
    resources.pool = &pool_;
    resources.wakes = &wakes_;
    resources.checkpoint_root = root_;
    return resources;
  }

  // Elements in chunk `chunk` (0 or 1) of the job.
  static int64_t ChunkElems(int64_t chunk) { return chunk == 0 ? 64 : kElems - 64; }
  // A piece of all of chunk `chunk`'s gradient for `step`, without data.
  static v1::GradientPiece Piece(int64_t step, int64_t chunk, int rank, DType dtype,
                                 int micro_batch = 0) {
    v1::GradientPiece piece;
    piece.set_job("job");
    piece.set_step(step);
    piece.set_chunk(chunk);
    piece.set_dp_rank(rank);
    piece.set_micro_batch(micro_batch);
    piece.set_dtype(DTypeToProto(dtype));
    return piece;
  }

  // Every element's gradient for `step` from dp rank `rank` is `value`.
  static absl::Status Push(Job& job, int64_t step, float value, int rank = 0) {
    const DType dtype = job.spec().dtype;
    for (int64_t chunk = 0; chunk < 2; ++chunk) {
      const int64_t n = ChunkElems(chunk);
      v1::GradientPiece piece = Piece(step, chunk, rank, dtype);
      std::string data(static_cast<size_t>(n) * DTypeSize(dtype), '\0');
      for (int64_t i = 0; i < n; ++i) {
        if (dtype == DType::kFloat32) {
          std::memcpy(data.data() + i * 4, &value, 4);
        } else {
          const uint16_t h = FloatToHalfBits(value);
          std::memcpy(data.data() + i * 2, &h, 2);
        }
      }
      piece.set_data(std::move(data));
      if (absl::Status s = job.PushGradient(ViewOf(piece), absl::InfiniteFuture()); !s.ok()) {
        return s;
      }
    }
    return absl::OkStatus();
  }

  // The served weights of `version` (fp32 jobs: the master), in order.
  static absl::StatusOr<std::string> Weights(Job& job, int64_t version) {
    v1::PullParamsRequest request;
    request.set_job("job");
    request.set_version(version);
    request.set_have_version(-1);
    std::map<std::pair<int, int64_t>, std::string> pieces;  // by tensor, offset
    ZO_RETURN_IF_ERROR(
        job.PullParams(request, absl::InfiniteFuture(), [&](const v1::ParamPiece& p) {
          pieces[{p.tensor(), p.offset()}] = p.data();
          return true;
        }));
    std::string out;
    for (const auto& [offset, data] : pieces) out += data;
    return out;
  }

  // Waits until `version` exists (or will never come).
  static absl::Status WaitForVersion(Job& job, int64_t version) {
    v1::PullParamsRequest request;
    request.set_job("job");
    request.set_version(version);
    request.set_have_version(-1);
    return job.PullParams(request, absl::InfiniteFuture(),
                          [](const v1::ParamPiece&) { return true; });
  }

  WakeQueue wakes_;
  ThreadPool pool_{2};
  std::string root_;
  int keep_checkpoints_ = 0;       // JobResources::keep_checkpoints of the next Open
  int64_t ram_budget_bytes_ = -1;  // JobResources::ram_budget_bytes of the next Open
  std::function<std::optional<int64_t>()> available_ram_;  // JobResources::available_ram
  absl::Duration nvme_latency_;                            // JobResources::nvme_latency
  std::function<void(int64_t, int64_t)> speculated_;       // JobResources::speculated
  std::function<void(int64_t)> applying_;                  // JobResources::applying
  std::function<void(int64_t)> committing_;                // JobResources::committing
  uint64_t init_fingerprint_ = 0;  // OpenJobRequest.init_fingerprint of the next Open
  // The manifest of the next Open: (elements, parameter group) per tensor,
  // adding up to kElems.
  std::vector<std::pair<int64_t, int>> tensors_ = {{kElems, 0}};
};

}  // namespace zo

#endif  // ZO_SERVER_JOB_TEST_FIXTURE_H_
