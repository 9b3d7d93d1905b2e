// What zo-server's metrics endpoint (--metrics-listen) shows, computed at
// each scrape from the jobs' own counters: per job the step time split
// (waiting for gradients, the update, serving pulls), gradient and weight
// bytes, steps and skipped steps, loss scale, gradient norm, lr, resident
// bytes per tier and the NVMe swap's bytes and latency; per RPC method the
// calls by status code. Names start with zo_server_; docs/metrics.md lists
// them.
#ifndef ZO_SERVER_SERVER_METRICS_H_
#define ZO_SERVER_SERVER_METRICS_H_

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "grpcpp/support/server_interceptor.h"
#include "prometheus/collectable.h"
#include "prometheus/metric_family.h"
#include "server/job_registry.h"

namespace zo {

// Thread-safe. The registry must outlive it.
class ServerMetrics : public prometheus::Collectable {
 public:
  explicit ServerMetrics(const JobRegistry* registry) : registry_(registry) {}

  // An interceptor factory for the server builder that counts each call's
  // final status; this object must outlive the server.
  std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface> CallCounter();
  // `method` as gRPC names it ("/zo.v1.Offload/PushGradients").
  void CountCall(const std::string& method, grpc::StatusCode code);

  std::vector<prometheus::MetricFamily> Collect() const override;

 private:
  const JobRegistry* const registry_;
  mutable std::mutex mu_;
  std::map<std::pair<std::string, int>, int64_t> calls_;  // (method, code) -> count
};

}  // namespace zo

#endif  // ZO_SERVER_SERVER_METRICS_H_
