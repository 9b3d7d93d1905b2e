#include "rpc/byte_stream_call.h"

#include <condition_variable>
#include <mutex>
#include <vector>

#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/support/client_callback.h"

namespace zo {

class ByteStreamCall::Reactor final
    : public grpc::ClientBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  void OnWriteDone(bool ok) override {
    std::lock_guard lock(mu_);
    write_pending_ = false;
    write_ok_ = ok;
    cv_.notify_all();
  }
  void OnReadDone(bool ok) override {
    std::lock_guard lock(mu_);
    got_response_ = ok;
  }
  void OnDone(const grpc::Status& status) override {
    std::lock_guard lock(mu_);
    status_ = status;
    done_ = true;
    cv_.notify_all();
  }

  bool Write(const grpc::ByteBuffer& message) {
    {
      std::lock_guard lock(mu_);
      write_pending_ = true;
    }
    StartWrite(&message);
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return !write_pending_; });
    return write_ok_;
  }
  grpc::Status AwaitDone(google::protobuf::MessageLite* response) {
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return done_; });
    if (!status_.ok() || response == nullptr) return status_;
    std::vector<grpc::Slice> slices;
    std::string bytes;
    if (!got_response_ || !response_.Dump(&slices).ok()) {
      return grpc::Status(grpc::StatusCode::INTERNAL, "the call ended OK without a response");
    }
    for (const grpc::Slice& s : slices) {
      bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
    }
    if (!response->ParseFromString(bytes)) {
      return grpc::Status(grpc::StatusCode::INTERNAL, "the response does not parse");
    }
    return status_;
  }

  grpc::ByteBuffer response_;

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool write_pending_ = false;
  bool write_ok_ = false;
  bool got_response_ = false;
  bool done_ = false;
  grpc::Status status_;
};

ByteStreamCall::ByteStreamCall(const std::shared_ptr<grpc::Channel>& channel,
                               grpc::ClientContext* context, const std::string& method)
    : reactor_(std::make_unique<Reactor>()) {
  grpc::GenericStub stub(channel);
  stub.PrepareBidiStreamingCall(context, method, grpc::StubOptions(), reactor_.get());
  reactor_->StartRead(&reactor_->response_);
  // Held until Finish: OnDone cannot come while this thread may still call
  // StartWrite, even when the server ends the call early.
  reactor_->AddHold();
  reactor_->StartCall();
}

ByteStreamCall::~ByteStreamCall() {
  if (!finished_) (void)Finish(nullptr);
}

bool ByteStreamCall::Write(const grpc::ByteBuffer& message) {
  if (broken_ || finished_) return false;
  broken_ = !reactor_->Write(message);
  return !broken_;
}

grpc::Status ByteStreamCall::Finish(google::protobuf::MessageLite* response) {
  finished_ = true;
  if (!broken_) reactor_->StartWritesDone();
  reactor_->RemoveHold();
  return reactor_->AwaitDone(response);
}

}  // namespace zo
