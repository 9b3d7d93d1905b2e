// The worker calls a job validates before touching state (server/job.h), fed
// as protobuf parses them off the wire, into a fresh one-server job per
// input (two tensors of 60 and 77 fp16 elements, chunks of 64, one dp rank):
//
//   PullParamsRequest -> CheckPullRequest, OpenPull and the whole cursor
//   ParamInitPiece    -> InitParams
//   GradientPiece     -> TryPushGradient (a complete step runs the update)
//
// Input: records of [kind % 3][u16 little-endian length][message bytes].
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "common/wake_queue.h"
#include "fuzz/fuzz_support.h"
#include "offload/thread_pool.h"
#include "proto/zo/v1/gradients.pb.h"
#include "proto/zo/v1/job.pb.h"
#include "proto/zo/v1/params.pb.h"
#include "server/gradient_piece_view.h"
#include "server/job.h"
#include "server/job_spec.h"

namespace {

zo::ThreadPool* pool = nullptr;
zo::WakeQueue* wakes = nullptr;
const zo::JobSpec* spec = nullptr;

zo::JobSpec Spec() {
  zo::v1::OpenJobRequest r;
  r.set_job("job");
  for (const auto& [name, elems] : {std::pair{"a", 60}, std::pair{"b", 77}}) {
    zo::v1::TensorSpec* t = r.mutable_manifest()->add_tensors();
    t->set_name(name);
    t->add_shape(elems);
    t->set_dtype(zo::v1::DTYPE_FP16);
  }
  r.set_config_json(
      R"({"train_batch_size": 1, "fp16": {"enabled": true}, "zo": {"chunk_elems": 64}})");
  r.set_dp_world_size(1);
  r.add_servers("127.0.0.1:1");
  absl::StatusOr<zo::JobSpec> s = zo::JobSpecFromRequest(r);
  if (!s.ok()) zo::fuzz::Fail("the job does not validate", s.status().ToString());
  return *std::move(s);
}

void Pull(zo::Job& job, const std::string& bytes) {
  zo::v1::PullParamsRequest request;
  if (!request.ParseFromString(bytes)) return;
  if (!job.CheckPullRequest(request).ok()) return;
  absl::StatusOr<zo::PullCursor> cursor = job.OpenPull(request);
  if (!cursor.ok()) return;
  zo::v1::ParamPiece piece;
  while (cursor->Next(&piece)) {
  }
}

void Init(zo::Job& job, const std::string& bytes) {
  zo::v1::ParamInitPiece piece;
  if (!piece.ParseFromString(bytes)) return;
  job.InitParams(piece).IgnoreError();
}

void PushGradient(zo::Job& job, const std::string& bytes) {
  zo::v1::GradientPiece piece;
  if (!piece.ParseFromString(bytes)) return;
  const zo::GradientPieceView view = zo::ViewOf(piece);
  zo::GradientAccumulator::PushWait wait;
  absl::StatusOr<zo::GradientAccumulator::PushOutcome> outcome =
      job.TryPushGradient(view, &wait, [] {});
  if (outcome.ok() && *outcome == zo::GradientAccumulator::PushOutcome::kWaiting) {
    job.CancelPushWait(view, wait);
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  zo::fuzz::QuietLogs();
  pool = new zo::ThreadPool(1);
  wakes = new zo::WakeQueue();
  spec = new zo::JobSpec(Spec());
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  zo::JobResources resources;
  resources.pool = pool;
  resources.wakes = wakes;
  absl::StatusOr<std::unique_ptr<zo::Job>> job = zo::Job::Create(*spec, resources);
  ZO_FUZZ_CHECK(job.ok(), job.status().ToString());
  for (size_t at = 0; at + 3 <= size;) {
    const int kind = data[at] % 3;
    const size_t len = std::min<size_t>(data[at + 1] | data[at + 2] << 8, size - at - 3);
    const std::string bytes(reinterpret_cast<const char*>(data + at + 3), len);
    at += 3 + len;
    switch (kind) {
      case 0:
        Pull(**job, bytes);
        break;
      case 1:
        Init(**job, bytes);
        break;
      default:
        PushGradient(**job, bytes);
        break;
    }
  }
  return 0;
}
