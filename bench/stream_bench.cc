#include "bench/stream_bench.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench/internal/bench_stats.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"
#include "server/offload_server.h"
#include "worker/data/char_dataset.h"
#include "worker/data/synthetic_source.h"
#include "worker/model/model.h"
#include "worker/train/trainer.h"

namespace zo::bench {
namespace {

using bench_internal::Median;

std::string Config(const StreamBenchOptions& o, int64_t live_parameters) {
  std::string zero = "{}";
  if (live_parameters > 0 && o.nvme_dir.empty()) {
    zero =
        absl::StrFormat(R"({"offload_param": {"device": "cpu"}, "stage3_max_live_parameters": %d})",
                        live_parameters);
  } else if (live_parameters > 0) {
    zero = absl::StrFormat(
        R"({"offload_param": {"device": "nvme", "nvme_path": "%s"},
            "stage3_max_live_parameters": %d})",
        o.nvme_dir, live_parameters);
  }
  return absl::StrFormat(
      R"({"train_micro_batch_size_per_gpu": %d, "gradient_accumulation_steps": %d,
          "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "weight_decay": 0.1}},
          "%s": {"enabled": true}, "gradient_clipping": 1.0, "steps_per_print": 1000000,
          "zero_optimization": %s, "zo": {"gradient_accumulation": "servers"}})",
      o.batch, o.micro_batches, o.dtype == DType::kFloat16 ? "fp16" : "bf16", zero);
}

struct Run {
  std::vector<double> losses;
  double step_s = 0;  // median of the second half
};

// zo-train's loop against an embedded server of its own.
absl::StatusOr<Run> TrainOnce(const StreamBenchOptions& o, const model::GptConfig& gpt,
                              int64_t live_parameters, const std::string& name) {
  ServerOptions server_options;
  server_options.listen = "";  // in-process only
  ZO_ASSIGN_OR_RETURN(std::unique_ptr<OffloadServer> server, OffloadServer::Start(server_options));
  const std::string metrics = absl::StrCat("/tmp/zo-bench-stream-", getpid(), "-", name, ".jsonl");
  std::remove(metrics.c_str());
  train::TrainOptions t;
  t.config_json = Config(o, live_parameters);
  t.model = "gpt";
  t.gpt = gpt;
  t.seed = o.seed;
  t.channels = {server->InProcessChannel()};
  t.routes = {server->DataRoute()};
  t.job = name;
  t.steps = o.steps;
  t.metrics_out = metrics;
  t.device = o.device;
  t.out = stderr;
  const absl::Status trained = train::Train(t);
  server->Shutdown(absl::Seconds(1));
  ZO_RETURN_IF_ERROR(trained);
  Run run;
  std::vector<double> step_s;
  std::ifstream in(metrics);
  std::string line;
  while (std::getline(in, line)) {
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded()) continue;
    run.losses.push_back(j["loss"].is_number() ? j["loss"].get<double>() : 0.0);
    step_s.push_back(j["step_s"].get<double>());
  }
  std::remove(metrics.c_str());
  if (static_cast<int>(step_s.size()) != o.steps) {
    return absl::InternalError(
        absl::StrCat("run ", name, " left ", step_s.size(), " of ", o.steps, " step lines"));
  }
  run.step_s = Median({step_s.begin() + static_cast<long>(step_s.size() / 2), step_s.end()});
  return run;
}

}  // namespace

absl::Status RunStreamBench(const StreamBenchOptions& o, std::ostream& out) {
  if (o.steps < 2 || o.rounds < 1 || !(o.window > 0 && o.window < 1)) {
    return absl::InvalidArgumentError(
        "stream: needs --steps >= 2, --rounds >= 1 and a --stream-window in (0, 1)");
  }
  // The model zo-train builds on its synthetic text.
  ZO_ASSIGN_OR_RETURN(CharDataset text,
                      CharDataset::FromText(SyntheticText(size_t{1} << 20, o.seed), o.seed));
  const model::GptConfig gpt{.n_layer = o.n_layer,
                             .n_embd = o.n_embd,
                             .n_head = o.n_head,
                             .block_size = o.block_size,
                             .vocab = text.vocab().size()};
  ZO_ASSIGN_OR_RETURN(model::Model m, model::MakeGpt(gpt));
  int64_t largest = 0;
  for (const auto& layer : m.layers) largest = std::max(largest, layer->param_count());
  const int64_t params = m.param_count();
  const int64_t live =
      std::max(largest, static_cast<int64_t>(o.window * static_cast<double>(params)));
  std::fprintf(stderr,
               "zo-bench stream: GPT %d layers x %d wide (%.2f M parameters, largest layer %.2f "
               "M); streamed runs keep %lld of them on %s, the rest %s\n",
               o.n_layer, o.n_embd, params / 1e6, largest / 1e6, static_cast<long long>(live),
               o.device.c_str(),
               o.nvme_dir.empty() ? "in the embedded server's own copy"
                                  : ("in a file in " + o.nvme_dir).c_str());

  std::vector<double> resident_s, streamed_s;
  std::vector<double> reference;
  bool equal = true;
  for (int r = 0; r < o.rounds; ++r) {
    for (const bool streamed : {false, true}) {
      const std::string name = absl::StrCat(streamed ? "streamed" : "resident", r);
      ZO_ASSIGN_OR_RETURN(const Run run, TrainOnce(o, gpt, streamed ? live : 0, name));
      (streamed ? streamed_s : resident_s).push_back(run.step_s);
      if (reference.empty()) reference = run.losses;
      equal = equal && run.losses == reference;
    }
  }
  const double ratio = Median(streamed_s) / Median(resident_s);
  if (o.json) {
    out << nlohmann::json{{"bench", "stream"},
                          {"row", "stream"},
                          {"device", o.device},
                          {"dtype", std::string(DTypeName(o.dtype))},
                          {"params", params},
                          {"live_params", live},
                          {"weights_on", o.nvme_dir.empty() ? "servers" : "nvme"},
                          {"micro_batches", o.micro_batches},
                          {"resident_step_s", Median(resident_s)},
                          {"streamed_step_s", Median(streamed_s)},
                          {"losses_equal", equal},
                          {"ratio", ratio}}
               .dump()
        << "\n";
  } else {
    out << absl::StrFormat(
        "stream  %s %s, %.2f M parameters, %lld live, the rest on %s: resident %.3f s/step, "
        "streamed %.3f s/step, ratio %.3f; losses %s\n",
        o.device, DTypeName(o.dtype), params / 1e6, static_cast<long long>(live),
        o.nvme_dir.empty() ? "the servers' copy" : "NVMe", Median(resident_s), Median(streamed_s),
        ratio, equal ? "equal bit for bit" : "DIFFER");
  }
  if (!equal)
    return absl::InternalError("the streamed runs' losses differ from the resident run's");
  return absl::OkStatus();
}

}  // namespace zo::bench
