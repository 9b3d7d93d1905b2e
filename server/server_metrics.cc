#include "server/server_metrics.h"

#include <string_view>

#include "absl/status/status.h"
#include "common/metric_families.h"

namespace zo {
namespace {

using prometheus::ClientMetric;
using prometheus::MetricFamily;
using prometheus::MetricType;

// Counts the status a call ends with. One per call, made by the factory.
class CallCounterInterceptor : public grpc::experimental::Interceptor {
 public:
  CallCounterInterceptor(ServerMetrics* metrics, std::string method)
      : metrics_(metrics), method_(std::move(method)) {}

  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            grpc::experimental::InterceptionHookPoints::PRE_SEND_STATUS)) {
      metrics_->CountCall(method_, methods->GetSendStatus().error_code());
    }
    methods->Proceed();
  }

 private:
  ServerMetrics* const metrics_;
  const std::string method_;
};

class CallCounterFactory : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  explicit CallCounterFactory(ServerMetrics* metrics) : metrics_(metrics) {}
  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override {
    return new CallCounterInterceptor(metrics_, info->method() == nullptr ? "" : info->method());
  }

 private:
  ServerMetrics* const metrics_;
};

// "/zo.v1.Offload/PushGradients" -> "PushGradients"; other services keep
// their full name.
std::string ShortMethod(const std::string& method) {
  constexpr std::string_view kOffload = "/zo.v1.Offload/";
  if (method.rfind(kOffload, 0) == 0) return method.substr(kOffload.size());
  return method;
}

// "DEADLINE_EXCEEDED": gRPC's and Abseil's codes are the same numbers.
std::string CodeName(int code) {
  return absl::StatusCodeToString(static_cast<absl::StatusCode>(code));
}

}  // namespace

std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>
ServerMetrics::CallCounter() {
  return std::make_unique<CallCounterFactory>(this);
}

void ServerMetrics::CountCall(const std::string& method, grpc::StatusCode code) {
  std::lock_guard lock(mu_);
  ++calls_[{ShortMethod(method), static_cast<int>(code)}];
}

std::vector<MetricFamily> ServerMetrics::Collect() const {
  MetricFamilies f;
  MetricFamily& jobs = f.Add("zo_server_jobs", "jobs open on this server", MetricType::Gauge);
  MetricFamily& version = f.Add(
      "zo_server_job_version", "latest version of the weights (finished steps)", MetricType::Gauge);
  MetricFamily& steps =
      f.Add("zo_server_job_steps_total", "steps finished on this server since the job opened",
            MetricType::Counter);
  MetricFamily& skipped = f.Add("zo_server_job_skipped_steps_total",
                                "steps skipped for an fp16 overflow", MetricType::Counter);
  MetricFamily& step_seconds =
      f.Add("zo_server_job_step_seconds_total",
            "where step time went: wait_gradients (from a step's opening until its gradients were "
            "complete), update (the optimizer step), serve_pulls (sending weights)",
            MetricType::Counter);
  MetricFamily& bytes =
      f.Add("zo_server_job_bytes_total",
            "payload bytes: direction=in gradients received, direction=out weights sent to pulls",
            MetricType::Counter);
  MetricFamily& pulls = f.Add("zo_server_job_pulls_total", "pulls served", MetricType::Counter);
  MetricFamily& speculated =
      f.Add("zo_server_job_speculated_chunks_total",
            "chunks updated before their step was decided (zo.speculative_update), by what the "
            "decision did: outcome=kept, outcome=redone (a skipped or clipped step)",
            MetricType::Counter);
  MetricFamily& redo_seconds =
      f.Add("zo_server_job_speculation_redo_seconds_total",
            "seconds the updates that replaced speculated ones took", MetricType::Counter);
  MetricFamily& loss_scale =
      f.Add("zo_server_job_loss_scale", "loss scale of the open step (1 without fp16)",
            MetricType::Gauge);
  MetricFamily& grad_norm = f.Add("zo_server_job_grad_norm",
                                  "global gradient L2 norm of the last step", MetricType::Gauge);
  MetricFamily& lr =
      f.Add("zo_server_job_lr", "learning rate of the last applied step", MetricType::Gauge);
  MetricFamily& resident =
      f.Add("zo_server_job_resident_bytes",
            "bytes this server holds for the job: tier=ram (optimizer state in RAM, swap buffers, "
            "gradient buffer, served versions), tier=nvme (optimizer state in swap files)",
            MetricType::Gauge);
  MetricFamily& healthy =
      f.Add("zo_server_job_healthy",
            "1 while the job steps; 0 while it needs a restore, waits on a peer server, or (on "
            "the lead) a follower is down",
            MetricType::Gauge);
  MetricFamily& checkpoint_failures =
      f.Add("zo_server_job_checkpoint_failures_total",
            "on the lead: checkpoint attempts that failed (the log and zo-ctl status say why)",
            MetricType::Counter);
  MetricFamily& follower_up =
      f.Add("zo_server_job_follower_up",
            "on the lead: 1 while follower `server` answers with the job, 0 while it is "
            "unreachable or restarted without it",
            MetricType::Gauge);
  MetricFamily& waiting =
      f.Add("zo_server_job_waiting_calls", "calls parked on the job: kind=pull or kind=push",
            MetricType::Gauge);
  MetricFamily& nvme_bytes =
      f.Add("zo_server_nvme_bytes_total", "bytes the NVMe swap read (op=read) and wrote (op=write)",
            MetricType::Counter);
  MetricFamily& nvme_requests =
      f.Add("zo_server_nvme_requests_total", "NVMe swap requests", MetricType::Counter);
  MetricFamily& nvme_seconds =
      f.Add("zo_server_nvme_request_seconds_total",
            "seconds NVMe swap requests took from submission to completion; divided by "
            "zo_server_nvme_requests_total: the mean latency",
            MetricType::Counter);
  MetricFamily& rpcs = f.Add("zo_server_rpcs_total",
                             "calls answered, by method and gRPC status code", MetricType::Counter);

  int open = 0;
  for (const std::string& name : registry_->Names()) {
    absl::StatusOr<std::shared_ptr<Job>> job = registry_->Find(name);
    if (!job.ok()) continue;  // closed since Names()
    ++open;
    const v1::JobStatus s = (*job)->Status();
    const JobTotals t = (*job)->Totals();
    const SwapIoStats io = (*job)->SwapStats();
    const ClientMetric::Label j{"zo_job", name};
    AddSample(version, {j}, static_cast<double>(s.version()));
    AddSample(steps, {j}, static_cast<double>(t.steps));
    AddSample(skipped, {j}, static_cast<double>(t.skipped_steps));
    AddSample(step_seconds, {j, {"phase", "wait_gradients"}}, t.wait_seconds);
    AddSample(step_seconds, {j, {"phase", "update"}}, t.update_seconds);
    AddSample(step_seconds, {j, {"phase", "serve_pulls"}}, t.serve_seconds);
    AddSample(bytes, {j, {"direction", "in"}}, static_cast<double>(t.gradient_bytes));
    AddSample(bytes, {j, {"direction", "out"}}, static_cast<double>(t.param_bytes));
    AddSample(pulls, {j}, static_cast<double>(t.pulls));
    AddSample(speculated, {j, {"outcome", "kept"}}, static_cast<double>(t.confirmed_chunks));
    AddSample(speculated, {j, {"outcome", "redone"}}, static_cast<double>(t.redone_chunks));
    AddSample(redo_seconds, {j}, t.redo_seconds);
    AddSample(loss_scale, {j}, s.loss_scale());
    AddSample(grad_norm, {j}, s.last_grad_norm());
    AddSample(lr, {j}, s.last_lr());
    AddSample(resident, {j, {"tier", "ram"}}, static_cast<double>(s.ram_bytes()));
    // master, m and v: 12 bytes per NVMe-resident element.
    AddSample(resident, {j, {"tier", "nvme"}}, 12.0 * static_cast<double>(s.nvme_elems()));
    if (s.server_index() == 0) {
      AddSample(checkpoint_failures, {j}, static_cast<double>(s.checkpoint_failures()));
    }
    bool followers_up = true;
    for (const v1::FollowerState& fs : s.followers()) {
      const bool up = fs.state() == v1::FollowerState::UP;
      followers_up = followers_up && up;
      AddSample(follower_up, {j, {"server", fs.server()}}, up ? 1.0 : 0.0);
    }
    AddSample(healthy, {j},
              s.needs_restore().empty() && s.waiting_on_peer().empty() && followers_up ? 1.0 : 0.0);
    AddSample(waiting, {j, {"kind", "pull"}}, s.waiting_pulls());
    AddSample(waiting, {j, {"kind", "push"}}, s.waiting_pushes());
    AddSample(nvme_bytes, {j, {"op", "read"}}, static_cast<double>(io.read_bytes));
    AddSample(nvme_bytes, {j, {"op", "write"}}, static_cast<double>(io.write_bytes));
    AddSample(nvme_requests, {j, {"op", "read"}}, static_cast<double>(io.reads));
    AddSample(nvme_requests, {j, {"op", "write"}}, static_cast<double>(io.writes));
    AddSample(nvme_seconds, {j, {"op", "read"}}, io.read_seconds);
    AddSample(nvme_seconds, {j, {"op", "write"}}, io.write_seconds);
  }
  AddSample(jobs, {}, open);
  {
    std::lock_guard lock(mu_);
    for (const auto& [key, count] : calls_) {
      AddSample(rpcs, {{"method", key.first}, {"code", CodeName(key.second)}},
                static_cast<double>(count));
    }
  }
  return f.Take();
}

}  // namespace zo
