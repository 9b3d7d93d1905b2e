// OffloadService through an in-process channel: the gRPC face of the job
// calls (token, status codes, streams), one server, no sockets.
#include "server/offload_service.h"

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/fp16.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "offload/checkpoint/checkpoint_test_util.h"
#include "rpc/error_detail.h"
#include "rpc/rpc_util.h"
#include "server/offload_server.h"

namespace zo {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using testing::IsOk;
using testing::IsOkAndHolds;
using testing::StatusIs;

constexpr char kToken[] = "sesame";
constexpr int kElems = 48;  // chunks of 32 and 16

class OffloadServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = testing::FreshTestDir(::testing::UnitTest::GetInstance()->current_test_info()->name());
    ServerOptions options;
    options.listen = "";
    options.threads = 2;
    options.auth_token = kToken;
    options.checkpoint_dir = root_;
    ZO_ASSERT_OK_AND_ASSIGN(server_, OffloadServer::Start(options));
    stub_ = v1::Offload::NewStub(server_->InProcessChannel());
  }
  void TearDown() override {
    server_->Shutdown(absl::ZeroDuration());
    std::filesystem::remove_all(root_);
  }

  std::unique_ptr<grpc::ClientContext> Context(bool with_token = true) {
    auto c = std::make_unique<grpc::ClientContext>();
    if (with_token) c->AddMetadata(kAuthMetadataKey, BearerValue(kToken));
    c->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    return c;
  }

  static v1::OpenJobRequest OpenRequest(const std::string& config, int dp = 1,
                                        v1::DType dtype = v1::DTYPE_FP32) {
    v1::OpenJobRequest r;
    r.set_job("svc");
    v1::TensorSpec* t = r.mutable_manifest()->add_tensors();
    t->set_name("w");
    t->add_shape(kElems);
    t->set_dtype(dtype);
    r.set_config_json(config);
    r.set_dp_world_size(dp);
    r.add_servers("127.0.0.1:1");
    return r;
  }

  absl::StatusOr<v1::OpenJobResponse> Open(const v1::OpenJobRequest& r) {
    v1::OpenJobResponse response;
    const grpc::Status s = stub_->OpenJob(Context().get(), r, &response);
    if (!s.ok()) return FromGrpcStatus(s);
    return response;
  }

  absl::StatusOr<v1::JobStatus> Status() {
    v1::GetJobStatusRequest r;
    r.set_job("svc");
    v1::JobStatus st;
    const grpc::Status s = stub_->GetJobStatus(Context().get(), r, &st);
    if (!s.ok()) return FromGrpcStatus(s);
    return st;
  }

  // Every element's gradient of `step` is `value`, in the job's dtype.
  absl::Status Push(int64_t step, float value, v1::DType dtype = v1::DTYPE_FP32) {
    v1::PushGradientsResponse response;
    auto context = Context();
    auto writer = stub_->PushGradients(context.get(), &response);
    for (int chunk = 0; chunk < 2; ++chunk) {
      const int n = chunk == 0 ? 32 : kElems - 32;
      v1::GradientPiece piece;
      piece.set_job("svc");
      piece.set_step(step);
      piece.set_chunk(chunk);
      piece.set_dtype(dtype);
      std::string data;
      for (int i = 0; i < n; ++i) {
        if (dtype == v1::DTYPE_FP32) {
          data.append(reinterpret_cast<const char*>(&value), 4);
        } else {
          const uint16_t h = FloatToHalfBits(value);
          data.append(reinterpret_cast<const char*>(&h), 2);
        }
      }
      piece.set_data(data);
      if (!writer->Write(piece)) break;
    }
    writer->WritesDone();
    return FromGrpcStatus(writer->Finish());
  }

  // Version `version` of every weight, as floats (fp32 jobs).
  absl::StatusOr<std::vector<float>> Pull(int64_t version) {
    v1::PullParamsRequest r;
    r.set_job("svc");
    r.set_version(version);
    r.set_have_version(-1);
    auto context = Context();
    auto reader = stub_->PullParams(context.get(), r);
    std::vector<float> w(kElems);
    v1::ParamPiece piece;
    while (reader->Read(&piece)) {
      std::memcpy(w.data() + piece.offset(), piece.data().data(), piece.data().size());
    }
    const grpc::Status s = reader->Finish();
    if (!s.ok()) return FromGrpcStatus(s);
    return w;
  }

  // Asks for the job's status until `done` holds for it; false if it never
  // did within many asks (no clock: the calls themselves pace it).
  bool StatusUntil(const std::function<bool(const v1::JobStatus&)>& done) {
    for (int i = 0; i < 200000; ++i) {
      absl::StatusOr<v1::JobStatus> st = Status();
      if (st.ok() && done(*st)) return true;
      std::this_thread::yield();
    }
    return false;
  }

  absl::Status Init(float value) {
    v1::InitParamsResponse response;
    auto context = Context();
    auto writer = stub_->InitParams(context.get(), &response);
    for (int chunk = 0; chunk < 2; ++chunk) {
      v1::ParamInitPiece piece;
      piece.set_job("svc");
      piece.set_chunk(chunk);
      const std::vector<float> v(chunk == 0 ? 32 : kElems - 32, value);
      piece.set_data(reinterpret_cast<const char*>(v.data()), v.size() * 4);
      writer->Write(piece);
    }
    writer->WritesDone();
    return FromGrpcStatus(writer->Finish());
  }

  std::string root_;
  std::unique_ptr<OffloadServer> server_;
  std::unique_ptr<v1::Offload::Stub> stub_;
};

// Threads of this process now (Linux).
int ThreadCount() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("Threads:", 0) == 0) return std::stoi(line.substr(8));
  }
  return -1;
}

// A pull through gRPC's callback client API, so that no client thread waits
// either: what the server does with many waiting pulls is all that counts.
class AsyncPull final : public grpc::ClientReadReactor<v1::ParamPiece> {
 public:
  AsyncPull(v1::Offload::Stub* stub, int64_t version) {
    context_.AddMetadata(kAuthMetadataKey, BearerValue(kToken));
    context_.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    request_.set_job("svc");
    request_.set_version(version);
    request_.set_have_version(-1);
    stub->async()->PullParams(&context_, &request_, this);
    StartRead(&piece_);
    StartCall();
  }
  void OnReadDone(bool ok) override {
    if (!ok) return;
    bytes_ += static_cast<int64_t>(piece_.data().size());
    StartRead(&piece_);
  }
  void OnDone(const grpc::Status& s) override {
    status_ = FromGrpcStatus(s);
    done_.Notify();
  }
  // The call's status and the payload bytes it read.
  absl::StatusOr<int64_t> Await() {
    done_.WaitForNotification();
    if (!status_.ok()) return status_;
    return bytes_;
  }

 private:
  grpc::ClientContext context_;
  v1::PullParamsRequest request_;
  v1::ParamPiece piece_;
  int64_t bytes_ = 0;
  absl::Status status_;
  absl::Notification done_;
};

// All of chunk 0 for step 2: it waits while step 1 is open.
v1::GradientPiece StepTwoChunkZero() {
  v1::GradientPiece piece;
  piece.set_job("svc");
  piece.set_step(2);
  piece.set_chunk(0);
  piece.set_dtype(v1::DTYPE_FP32);
  piece.set_data(std::string(32 * 4, '\0'));
  return piece;
}

const char kConfig[] =
    R"({"train_micro_batch_size_per_gpu": 1, "gradient_clipping": 0, "zo": {"chunk_elems": 32},
        "optimizer": {"type": "AdamW", "params": {"lr": 0.01, "weight_decay": 0}}})";

TEST_F(OffloadServiceTest, CallsWithoutTheTokenAreUnauthenticated) {
  v1::GetJobStatusRequest r;
  r.set_job("svc");
  v1::JobStatus st;
  const grpc::Status s = stub_->GetJobStatus(Context(/*with_token=*/false).get(), r, &st);
  EXPECT_THAT(FromGrpcStatus(s),
              StatusIs(absl::StatusCode::kUnauthenticated, HasSubstr("requires a token")));
  EXPECT_THAT(Status().status(), StatusIs(absl::StatusCode::kNotFound, HasSubstr("no job")));
  // Across the wire, the typed detail the lead and the workers act on.
  const std::optional<v1::ErrorDetail> no_job = DetailOf(Status().status());
  ASSERT_TRUE(no_job.has_value());
  EXPECT_EQ(no_job->reason(), v1::ErrorDetail::NO_JOB);
  EXPECT_EQ(no_job->job(), "svc");
}

TEST_F(OffloadServiceTest, AttachingNamesWhatDiffers) {
  ZO_ASSERT_OK_AND_ASSIGN(v1::OpenJobResponse opened, Open(OpenRequest(kConfig)));
  EXPECT_FALSE(opened.attached());
  ZO_ASSERT_OK_AND_ASSIGN(v1::OpenJobResponse again, Open(OpenRequest(kConfig)));
  EXPECT_TRUE(again.attached());
  EXPECT_THAT(Open(OpenRequest(kConfig, /*dp=*/2)).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("dp_world_size 2 differs from the job's 1")));
  std::string other = kConfig;
  other.replace(other.find("0.01"), 4, "0.02");
  EXPECT_THAT(Open(OpenRequest(other)).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("optimizer.params.lr is 0.02, the job's is 0.01")));
}

// AdamW's first step moves every weight by lr against the gradient's sign.
TEST_F(OffloadServiceTest, AStepThroughTheWireAndItsStatusSurviveARestore) {
  ASSERT_THAT(Open(OpenRequest(kConfig)).status(), IsOk());
  ASSERT_THAT(Init(1.0f), IsOk());
  ASSERT_THAT(Push(1, 0.5f), IsOk());
  ZO_ASSERT_OK_AND_ASSIGN(const std::vector<float> v1, Pull(1));
  for (float x : v1) EXPECT_NEAR(x, 1.0f - 0.01f, 1e-6f);
  ZO_ASSERT_OK_AND_ASSIGN(const v1::JobStatus st1, Status());
  EXPECT_EQ(st1.version(), 1);
  EXPECT_DOUBLE_EQ(st1.last_grad_norm(), std::sqrt(kElems * 0.25));
  EXPECT_DOUBLE_EQ(st1.last_lr(), 0.01);

  v1::CheckpointRequest ck;
  ck.set_job("svc");
  v1::CheckpointResponse saved;
  ASSERT_TRUE(stub_->Checkpoint(Context().get(), ck, &saved).ok());
  ASSERT_THAT(Push(2, -4.0f), IsOk());
  ASSERT_THAT(Pull(2).status(), IsOk());

  v1::RestoreRequest rr;
  rr.set_job("svc");
  rr.set_path(saved.path());
  v1::RestoreResponse restored;
  ASSERT_TRUE(stub_->Restore(Context().get(), rr, &restored).ok());
  EXPECT_EQ(restored.version(), 1);
  ZO_ASSERT_OK_AND_ASSIGN(const v1::JobStatus st, Status());
  EXPECT_EQ(st.version(), 1);
  EXPECT_EQ(st.last_grad_norm(), st1.last_grad_norm());
  EXPECT_EQ(st.last_lr(), st1.last_lr());
  ZO_ASSERT_OK_AND_ASSIGN(const std::vector<float> back, Pull(1));
  EXPECT_EQ(back, v1);
}

// A worker with several connections pulls a stripe of the server's chunks
// on each (PullParamsRequest.stripe/stripes): chunk 0 holds elements
// [0, 32), chunk 1 [32, 48). Stripes out of range are refused.
TEST_F(OffloadServiceTest, AStripedPullServesItsChunksAlone) {
  ZO_ASSERT_OK_AND_ASSIGN(const v1::OpenJobResponse opened, Open(OpenRequest(kConfig)));
  EXPECT_TRUE(opened.pull_stripes());
  ASSERT_THAT(Init(1.0f), IsOk());
  auto pull = [&](int stripe, int stripes) -> absl::StatusOr<std::vector<int64_t>> {
    v1::PullParamsRequest r;
    r.set_job("svc");
    r.set_version(0);
    r.set_have_version(-1);
    r.set_stripe(stripe);
    r.set_stripes(stripes);
    auto context = Context();
    auto reader = stub_->PullParams(context.get(), r);
    std::vector<int64_t> elements;
    v1::ParamPiece piece;
    while (reader->Read(&piece)) {
      for (int64_t i = 0; i < static_cast<int64_t>(piece.data().size() / 4); ++i) {
        elements.push_back(piece.offset() + i);
      }
    }
    ZO_RETURN_IF_ERROR(FromGrpcStatus(reader->Finish()));
    return elements;
  };
  ZO_ASSERT_OK_AND_ASSIGN(const std::vector<int64_t> first, pull(0, 2));
  ZO_ASSERT_OK_AND_ASSIGN(const std::vector<int64_t> second, pull(1, 2));
  ASSERT_EQ(first.size(), 32u);
  EXPECT_EQ(first.front(), 0);
  EXPECT_EQ(first.back(), 31);
  ASSERT_EQ(second.size(), 16u);
  EXPECT_EQ(second.front(), 32);
  ZO_ASSERT_OK_AND_ASSIGN(const std::vector<int64_t> third_of_three, pull(2, 3));
  EXPECT_TRUE(third_of_three.empty());
  ZO_ASSERT_OK_AND_ASSIGN(const std::vector<int64_t> all, pull(0, 0));
  EXPECT_EQ(all.size(), static_cast<size_t>(kElems));
  for (const auto& [stripe, stripes] : {std::pair{2, 2}, {-1, 2}, {0, 65}, {0, -1}, {1, 0}}) {
    EXPECT_THAT(pull(stripe, stripes),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("stripe")))
        << stripe << " of " << stripes;
  }
}

// A waiting pull is a callback the job keeps, not a server thread: 64 pulls
// of a version to come add (almost) no threads, and all are served once it
// exists. A thread-per-call server would hold 64 more threads here.
TEST_F(OffloadServiceTest, WaitingPullsParkNoThreads) {
  ASSERT_THAT(Open(OpenRequest(kConfig)).status(), IsOk());
  ASSERT_THAT(Init(1.0f), IsOk());
  ASSERT_THAT(Pull(0).status(), IsOk());
  constexpr int kPulls = 64;
  const int before = ThreadCount();
  std::vector<std::unique_ptr<AsyncPull>> pulls;
  for (int i = 0; i < kPulls; ++i) pulls.push_back(std::make_unique<AsyncPull>(stub_.get(), 1));
  ASSERT_TRUE(StatusUntil([](const v1::JobStatus& st) { return st.waiting_pulls() == kPulls; }));
  EXPECT_LT(ThreadCount() - before, 16) << "threads grew with the waiting pulls";

  ASSERT_THAT(Push(1, 0.5f), IsOk());
  for (auto& pull : pulls) EXPECT_THAT(pull->Await(), IsOkAndHolds(kElems * 4));
  ZO_ASSERT_OK_AND_ASSIGN(const v1::JobStatus st, Status());
  EXPECT_EQ(st.waiting_pulls(), 0);
}

// A push for the step after its chunk's waits as a kept callback: it goes
// in once the step before is done; cancelled while it waits, the server
// takes the callback back and the call ends.
TEST_F(OffloadServiceTest, AWaitingPushGoesInAfterTheStepBeforeOrEndsWhenCancelled) {
  ASSERT_THAT(Open(OpenRequest(kConfig)).status(), IsOk());
  ASSERT_THAT(Init(1.0f), IsOk());

  {
    auto context = Context();
    v1::PushGradientsResponse response;
    auto writer = stub_->PushGradients(context.get(), &response);
    ASSERT_TRUE(writer->Write(StepTwoChunkZero()));
    ASSERT_TRUE(StatusUntil([](const v1::JobStatus& st) { return st.waiting_pushes() == 1; }));
    context->TryCancel();
    EXPECT_EQ(writer->Finish().error_code(), grpc::StatusCode::CANCELLED);
    ASSERT_TRUE(StatusUntil([](const v1::JobStatus& st) { return st.waiting_pushes() == 0; }));
  }

  absl::Status early;
  std::thread step2([&] { early = Push(2, 0.25f); });
  ASSERT_TRUE(StatusUntil([](const v1::JobStatus& st) { return st.waiting_pushes() == 1; }));
  ASSERT_THAT(Push(1, 0.5f), IsOk());
  step2.join();
  ASSERT_THAT(early, IsOk());
  ZO_ASSERT_OK_AND_ASSIGN(const std::vector<float> w2, Pull(2));
  ZO_ASSERT_OK_AND_ASSIGN(const v1::JobStatus st, Status());
  EXPECT_EQ(st.version(), 2);
  EXPECT_EQ(st.last_grad_norm(), std::sqrt(kElems * 0.25 * 0.25));
}

// Cancellation racing the wake: half of 16 waiting pushes are cancelled while
// the step before completes and wakes them all. Every call finishes exactly
// once (a second Finish or a wake after OnDone would crash or hang here, and
// under ASan), and no wake is left behind.
TEST_F(OffloadServiceTest, CancelledAndWokenPushesEachFinishOnce) {
  ASSERT_THAT(Open(OpenRequest(kConfig)).status(), IsOk());
  ASSERT_THAT(Init(1.0f), IsOk());
  constexpr int kPushes = 16;  // two elements of chunk 0 each
  std::vector<std::unique_ptr<grpc::ClientContext>> contexts;
  std::vector<v1::PushGradientsResponse> responses(kPushes);
  std::vector<std::unique_ptr<grpc::ClientWriter<v1::GradientPiece>>> writers;
  for (int i = 0; i < kPushes; ++i) {
    contexts.push_back(Context());
    writers.push_back(stub_->PushGradients(contexts.back().get(), &responses[i]));
    v1::GradientPiece piece;
    piece.set_job("svc");
    piece.set_step(2);
    piece.set_chunk(0);
    piece.set_offset(2 * i);
    piece.set_dtype(v1::DTYPE_FP32);
    piece.set_data(std::string(2 * 4, '\0'));
    ASSERT_TRUE(writers.back()->Write(piece));
  }
  ASSERT_TRUE(StatusUntil([](const v1::JobStatus& st) { return st.waiting_pushes() == kPushes; }));
  std::thread canceller([&] {
    for (int i = 0; i < kPushes; i += 2) contexts[i]->TryCancel();
  });
  ASSERT_THAT(Push(1, 0.5f), IsOk());
  canceller.join();
  for (int i = 0; i < kPushes; ++i) {
    if (i % 2 == 1) writers[i]->WritesDone();
    const grpc::Status s = writers[i]->Finish();
    if (i % 2 == 1) {
      EXPECT_TRUE(s.ok()) << i << ": " << s.error_message();
      EXPECT_EQ(responses[i].pieces(), 1) << i;
    } else {
      EXPECT_TRUE(s.ok() || s.error_code() == grpc::StatusCode::CANCELLED) << i;
    }
  }
  ASSERT_THAT(Pull(1).status(), IsOk());  // waits for step 1's update
  ZO_ASSERT_OK_AND_ASSIGN(const v1::JobStatus st, Status());
  EXPECT_EQ(st.waiting_pushes(), 0);
  EXPECT_EQ(st.version(), 1);
}

// A server stopping with calls waiting on it ends each of them (the job's
// stop posts their wakes) instead of hanging its shutdown on them.
TEST_F(OffloadServiceTest, ShutdownEndsTheCallsThatWait) {
  ASSERT_THAT(Open(OpenRequest(kConfig)).status(), IsOk());
  ASSERT_THAT(Init(1.0f), IsOk());
  std::vector<std::unique_ptr<AsyncPull>> pulls;
  for (int i = 0; i < 4; ++i) pulls.push_back(std::make_unique<AsyncPull>(stub_.get(), 1));
  auto context = Context();
  v1::PushGradientsResponse response;
  auto writer = stub_->PushGradients(context.get(), &response);
  ASSERT_TRUE(writer->Write(StepTwoChunkZero()));
  ASSERT_TRUE(StatusUntil(
      [](const v1::JobStatus& st) { return st.waiting_pulls() == 4 && st.waiting_pushes() == 1; }));

  server_->Shutdown(absl::Seconds(30));
  for (auto& pull : pulls) {
    EXPECT_THAT(pull->Await(),
                StatusIs(absl::StatusCode::kUnavailable, HasSubstr("shutting down")));
  }
  // The push ends UNAVAILABLE too; its message may be the in-process
  // transport's "Transport closed", which can overtake the server's status
  // on a stream the client has not half-closed.
  const grpc::Status pushed = writer->Finish();
  EXPECT_EQ(pushed.error_code(), grpc::StatusCode::UNAVAILABLE) << pushed.error_message();
}

TEST_F(OffloadServiceTest, AJobStuckAtTheMinimumScaleFailsWithAClearStatus) {
  ASSERT_THAT(Open(OpenRequest(R"({"train_batch_size": 1, "zo": {"chunk_elems": 32,
                  "max_consecutive_skips": 3}, "fp16": {"enabled": true,
                  "initial_scale_power": 0, "min_loss_scale": 1}})",
                               1, v1::DTYPE_FP16))
                  .status(),
              IsOk());
  const float inf = std::numeric_limits<float>::infinity();
  for (int step = 1; step <= 3; ++step) {
    ASSERT_THAT(Push(step, inf, v1::DTYPE_FP16), IsOk()) << step;
    // Waits for the (skipped) step; fp16 bytes do not matter here.
    v1::PullParamsRequest r;
    r.set_job("svc");
    r.set_version(step);
    r.set_have_version(-1);
    auto context = Context();
    auto reader = stub_->PullParams(context.get(), r);
    v1::ParamPiece piece;
    while (reader->Read(&piece)) {
    }
    ASSERT_TRUE(reader->Finish().ok()) << step;
  }
  const auto failed = AllOf(HasSubstr("3 consecutive steps were skipped"),
                            HasSubstr("fp16.min_loss_scale"), HasSubstr("Lower the learning rate"));
  ZO_ASSERT_OK_AND_ASSIGN(const v1::JobStatus st, Status());
  EXPECT_THAT(st.needs_restore(), failed);
  EXPECT_THAT(Push(4, 1.0f, v1::DTYPE_FP16),
              StatusIs(absl::StatusCode::kFailedPrecondition, failed));
  EXPECT_THAT(Pull(4).status(), StatusIs(absl::StatusCode::kFailedPrecondition, failed));
}

}  // namespace
}  // namespace zo
