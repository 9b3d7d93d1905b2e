// A Prometheus scrape endpoint: GET /metrics answered with the text format
// of what the registered collectables say at the moment of the scrape
// (prometheus-cpp's Collectable and TextSerializer). zo-server and zo-train
// each run one when given --metrics-listen.
//
// The HTTP side is our own small server, one thread, one connection at a
// time, not prometheus-cpp's civetweb exposer: civetweb starts its threads
// with a fixed ~100 KiB stack, smaller than the static TLS of a process that
// loads cuBLASLt and OpenBLAS (~160 KiB), so in zo-train its threads cannot
// start at all.
//
//   ZO_ASSIGN_OR_RETURN(auto endpoint, MetricsEndpoint::Start("0.0.0.0:9400", {metrics}));
//   ZO_LOG(INFO) << "metrics at " << endpoint->url();
#ifndef ZO_COMMON_METRICS_ENDPOINT_H_
#define ZO_COMMON_METRICS_ENDPOINT_H_

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"

namespace prometheus {
class Collectable;
}  // namespace prometheus

namespace zo {

class MetricsEndpoint {
 public:
  // Listens on `listen` ("host:port", port 0 picks a free one; the host a
  // numeric address of this machine). INVALID_ARGUMENT for a bad address,
  // UNAVAILABLE when it cannot be bound. The collectables must stay valid
  // until the endpoint is destroyed.
  static absl::StatusOr<std::unique_ptr<MetricsEndpoint>> Start(
      const std::string& listen, std::vector<std::shared_ptr<prometheus::Collectable>> from);
  ~MetricsEndpoint();  // stops answering, closes the port

  int port() const { return port_; }
  // "http://host:port/metrics", for the log.
  const std::string& url() const { return url_; }

  MetricsEndpoint(const MetricsEndpoint&) = delete;
  MetricsEndpoint& operator=(const MetricsEndpoint&) = delete;

 private:
  MetricsEndpoint(int listen_fd, int stop_fd, int port, std::string url,
                  std::vector<std::shared_ptr<prometheus::Collectable>> from);
  void Serve();
  void Answer(int fd);
  std::string Body() const;

  const int listen_fd_;
  const int stop_fd_;  // an eventfd: readable once the destructor runs
  const int port_;
  const std::string url_;
  const std::vector<std::shared_ptr<prometheus::Collectable>> from_;
  std::thread thread_;
};

}  // namespace zo

#endif  // ZO_COMMON_METRICS_ENDPOINT_H_
