// The plain-TCP baseline of `zo-bench wire`: a sender that pushes a buffer
// over one loopback connection in fixed-size send() calls, and a sink that
// reads into one reusable buffer, discards, and acknowledges.
//
// Protocol, per round on one connection: the sender writes an 8-byte
// little-endian byte count, then that many bytes; the sink answers with one
// byte once it has read them all. A round's time is from the sender's first
// byte to that answer, so both ends have seen every byte.
#ifndef ZO_BENCH_INTERNAL_TCP_STREAM_H_
#define ZO_BENCH_INTERNAL_TCP_STREAM_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <thread>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace zo::bench_internal {

// Listens on 127.0.0.1 (a free port) and serves one connection at a time on
// a thread of its own, each read into a buffer of `read_bytes`. Not
// copyable; Stop (or the destructor) closes the socket and joins.
class TcpSink {
 public:
  static absl::StatusOr<std::unique_ptr<TcpSink>> Start(size_t read_bytes);
  ~TcpSink();  // Stop()

  int port() const { return port_; }
  // Stops accepting, ends the connection being served and joins the thread.
  void Stop();

  TcpSink(const TcpSink&) = delete;
  TcpSink& operator=(const TcpSink&) = delete;

 private:
  TcpSink(int listen_fd, int port, size_t read_bytes);
  void Run();
  // Serves rounds on `fd` until the peer closes it or a read fails.
  void Serve(int fd);

  const int listen_fd_;
  const int port_;
  const size_t read_bytes_;
  std::atomic<bool> stop_{false};
  std::atomic<int> conn_fd_{-1};
  std::thread thread_;
};

// One connection to a TcpSink. Not thread-safe.
class TcpSender {
 public:
  // Connects to 127.0.0.1:`port`.
  static absl::StatusOr<std::unique_ptr<TcpSender>> Connect(int port);
  ~TcpSender();

  // Sends `data` in send() calls of at most `write_bytes` each and waits for
  // the sink's acknowledgement.
  absl::Status SendRound(absl::Span<const std::byte> data, size_t write_bytes);

  TcpSender(const TcpSender&) = delete;
  TcpSender& operator=(const TcpSender&) = delete;

 private:
  explicit TcpSender(int fd) : fd_(fd) {}
  const int fd_;
};

}  // namespace zo::bench_internal

#endif  // ZO_BENCH_INTERNAL_TCP_STREAM_H_
