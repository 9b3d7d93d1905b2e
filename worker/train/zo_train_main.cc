// zo-train: trains GPT-lite or the benchmark MLP with its optimizer on zo
// offload servers — remote ones (--servers), or an embedded in-process server
// when none are given (the README's demo).
//
// The embedded default links the server library into this binary; the worker
// still reaches it only through the protocol, over an in-process gRPC channel.
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/command_line.h"
#include "common/config.h"
#include "common/logging.h"
#include "common/malloc_tuning.h"
#include "common/metrics_endpoint.h"
#include "common/units.h"
#include "server/offload_server.h"
#include "worker/train/train_metrics.h"
#include "worker/train/trainer.h"

ABSL_FLAG(std::string, config, "",
          "DeepSpeed-style JSON config (batch sizes, optimizer, scheduler, fp16/bf16, clipping, "
          "zo.dpu); empty: the built-in demo config (see --help)");
ABSL_FLAG(std::string, model, "gpt", "gpt (character-level GPT-lite) or mlp (benchmark MLP)");
ABSL_FLAG(int, n_layer, 4, "GPT-lite: transformer blocks");
ABSL_FLAG(int, n_embd, 128, "GPT-lite: embedding width");
ABSL_FLAG(int, n_head, 4, "GPT-lite: attention heads (must divide --n-embd)");
ABSL_FLAG(int, block_size, 64, "GPT-lite: context length in characters");
ABSL_FLAG(int, mlp_width, 256, "MLP: width W");
ABSL_FLAG(int, mlp_depth, 4, "MLP: hidden layers L");
ABSL_FLAG(int, mlp_classes, 16, "MLP: classes C (label floor(x.x) mod C)");
ABSL_FLAG(std::string, data, "",
          "GPT-lite: a text file to train on (character level); empty: built-in synthetic text");
ABSL_FLAG(uint64_t, seed, 1337, "seed of the data order and the initial weights");
ABSL_FLAG(int, pipeline_stages, 1, "pipeline stages the model is cut into");
ABSL_FLAG(int, stage, -1,
          "run only this stage (a multi-process pipeline: one zo-train per stage, with "
          "--stage-addresses and --servers); -1: every stage as a thread of this process");
ABSL_FLAG(std::string, stage_addresses, "",
          "host:port of every stage's process, comma-separated, in stage order (with --stage)");
ABSL_FLAG(std::string, schedule, "1f1b", "pipeline schedule: gpipe, 1f1b or interleaved");
ABSL_FLAG(int, virtual_chunks, 1, "interleaved schedule: model chunks per stage");
ABSL_FLAG(std::string, partition_method, "parameters",
          "how layers are cut into stages: parameters, uniform or type:REGEX (e.g. type:block)");
ABSL_FLAG(int, activation_checkpoint_every, 0,
          "keep activations only every N layers and recompute the rest in backward; 0: off");
ABSL_FLAG(std::string, device_memory_budget, "",
          "device memory per device, e.g. 20GiB: each stage keeps only a window of its "
          "layers' weights on the device, planned before the first step so that activations, "
          "one layer's gradients and the window fit (stages of one process share it equally; "
          "the rest of the weights come from the servers' own copy when they share this host, "
          "else from a host copy, or from a file with offload_param \"nvme\"); "
          "it counts tensors, so leave room for what a GPU library keeps beside them (cuBLAS's "
          "workspace, the allocator's rounding); refused when one layer plus the step does not "
          "fit; empty: no budget");
ABSL_FLAG(std::string, servers, "",
          "offload servers, host:port comma-separated in the same order for every worker "
          "(waited for up to 5 minutes when unreachable at start); empty: an embedded "
          "in-process server");
ABSL_FLAG(std::string, job, "zo-train", "job name on the servers (a restarted worker re-attaches)");
ABSL_FLAG(std::string, auth_token_file, "", "file holding the servers' shared token");
ABSL_FLAG(std::string, tls_ca, "", "PEM root certificates: talk TLS to --servers");
ABSL_FLAG(int, dp_rank, 0, "this worker's data-parallel rank");
ABSL_FLAG(int, dp_world_size, 1, "data-parallel ranks training the job");
ABSL_FLAG(int64_t, steps, 200, "train until the job has done this many steps");
ABSL_FLAG(int64_t, checkpoint_every, 0,
          "ask the servers for a checkpoint every N steps (needs a checkpoint directory on the "
          "servers; --checkpoint-dir for the embedded one); 0: never");
ABSL_FLAG(std::string, checkpoint_dir, "",
          "embedded server: where checkpoints go and --restore looks");
ABSL_FLAG(std::string, restore, "",
          "before training, restore the job from a checkpoint: 'latest' (the servers' newest "
          "for this job) or a checkpoint directory; then train on to --steps");
ABSL_FLAG(bool, restore_force, false,
          "let --restore roll back a job that trained past the checkpoint; without it such a "
          "restore is refused, and one of a job already at its latest checkpoint does nothing");
ABSL_FLAG(std::string, metrics_listen, "",
          "serve Prometheus metrics (GET /metrics) on this host:port, e.g. 0.0.0.0:9401; port 0 "
          "picks a free one (printed at the start); empty: no metrics endpoint");
ABSL_FLAG(std::string, metrics_out, "",
          "append one JSON object per step (step, loss, loss_scale, skipped, step_s, "
          "samples_per_s, ...) to this file");
ABSL_FLAG(int, blas_threads, 0,
          "OpenBLAS threads (0: OpenBLAS's default, or the cores shared out among the stages "
          "when several run in this process)");
ABSL_FLAG(std::string, device, "auto",
          "what computes the forward and backward: auto (a CUDA GPU when this build has the "
          "CUDA backend and the machine a GPU, else the CPU), cuda or cpu");
ABSL_FLAG(int, gpu, 0, "--device cuda: which GPU (CUDA device index)");
ABSL_FLAG(bool, deterministic, false,
          "CUDA: the same inputs give the same bits run after run (GEMMs without split-K; a "
          "little slower)");
ABSL_FLAG(bool, verbose, false,
          "also print the info log (connections, the embedded server's step lines) to stderr");

namespace zo {
namespace {

// The demo: fp16 with dynamic loss scaling, AdamW with a linear warmup and
// clipping. No DPU: on a model this small the server step is a fraction of
// the compute step, so DPU saves nothing, and its one-step-stale gradients
// set the steep early descent back (1.62 -> 2.61 when it switched on at step
// 40; an independent PyTorch twin with stale gradients does the same).
constexpr char kDemoConfig[] = R"({
  "train_micro_batch_size_per_gpu": 16,
  "gradient_accumulation_steps": 2,
  "optimizer": {"type": "AdamW",
                "params": {"lr": 2e-3, "betas": [0.9, 0.99], "weight_decay": 0.01}},
  "scheduler": {"type": "WarmupLR",
                "params": {"warmup_min_lr": 0, "warmup_max_lr": 2e-3,
                           "warmup_num_steps": 20, "warmup_type": "linear"}},
  "fp16": {"enabled": true, "initial_scale_power": 12},
  "gradient_clipping": 1.0,
  "steps_per_print": 10
})";

std::string Usage() {
  return absl::StrCat(
      "trains a model with its optimizer offloaded to zo servers.\n\n"
      "usage: zo-train [--model gpt|mlp] [--data FILE] [--steps N] [--config ds_config.json]\n"
      "                [--pipeline-stages P [--stage S --stage-addresses h:p,...]]\n"
      "                [--servers host:port,...] [--metrics-out FILE] [--metrics-listen ADDR]\n\n"
      "Without --servers the optimizer runs on an embedded in-process server.\n"
      "Without --config this demo config is used:\n",
      kDemoConfig, "\n\nFlags may be written with dashes or underscores.");
}

std::vector<std::string> SplitList(const std::string& text) {
  std::vector<std::string> out;
  for (absl::string_view part : absl::StrSplit(text, ',', absl::SkipWhitespace())) {
    out.emplace_back(absl::StripAsciiWhitespace(part));
  }
  return out;
}

absl::Status Run() {
  // The progress lines are the output; the log is for when something is off.
  if (!absl::GetFlag(FLAGS_verbose)) SetMinLogLevel(LogLevel::kWarning);
  train::TrainOptions o;
  if (std::string path = absl::GetFlag(FLAGS_config); !path.empty()) {
    // Loaded here so that errors and warnings name the file. The client and
    // the servers get it as ConfigToJson: they parse it again, and the
    // normalised form has no unknown or renamed keys to warn about twice.
    absl::StatusOr<LoadedConfig> loaded =
        LoadConfigFile(path, {.dp_world_size = absl::GetFlag(FLAGS_dp_world_size)});
    if (!loaded.ok()) {
      return absl::Status(loaded.status().code(),
                          absl::StrCat("--config: ", loaded.status().message()));
    }
    o.config_json = ConfigToJson(loaded->config);
  } else {
    o.config_json = kDemoConfig;
  }
  o.model = absl::GetFlag(FLAGS_model);
  o.gpt = {.n_layer = absl::GetFlag(FLAGS_n_layer),
           .n_embd = absl::GetFlag(FLAGS_n_embd),
           .n_head = absl::GetFlag(FLAGS_n_head),
           .block_size = absl::GetFlag(FLAGS_block_size)};
  o.mlp = {.width = absl::GetFlag(FLAGS_mlp_width),
           .depth = absl::GetFlag(FLAGS_mlp_depth),
           .classes = absl::GetFlag(FLAGS_mlp_classes)};
  o.data_path = absl::GetFlag(FLAGS_data);
  o.seed = absl::GetFlag(FLAGS_seed);
  o.pipeline_stages = absl::GetFlag(FLAGS_pipeline_stages);
  o.stage = absl::GetFlag(FLAGS_stage);
  o.stage_addresses = SplitList(absl::GetFlag(FLAGS_stage_addresses));
  o.schedule = absl::GetFlag(FLAGS_schedule);
  o.virtual_chunks = absl::GetFlag(FLAGS_virtual_chunks);
  o.partition_method = absl::GetFlag(FLAGS_partition_method);
  o.activation_checkpoint_every = absl::GetFlag(FLAGS_activation_checkpoint_every);
  if (std::string budget = absl::GetFlag(FLAGS_device_memory_budget); !budget.empty()) {
    auto bytes = ParseBytes("device-memory-budget", budget);
    if (!bytes.ok()) return bytes.status();
    if (*bytes == 0) return absl::InvalidArgumentError("--device-memory-budget must be positive");
    o.device_memory_budget = *bytes;
  }
  o.servers = SplitList(absl::GetFlag(FLAGS_servers));
  o.job = absl::GetFlag(FLAGS_job);
  if (std::string path = absl::GetFlag(FLAGS_auth_token_file); !path.empty()) {
    auto token = ReadTokenFile("auth-token-file", path);
    if (!token.ok()) return token.status();
    o.auth_token = *std::move(token);
  }
  if (std::string path = absl::GetFlag(FLAGS_tls_ca); !path.empty()) {
    auto ca = ReadFlagFile("tls-ca", path);
    if (!ca.ok()) return ca.status();
    o.tls_root_certs = *ca;
  }
  o.dp_rank = absl::GetFlag(FLAGS_dp_rank);
  o.dp_world_size = absl::GetFlag(FLAGS_dp_world_size);
  o.steps = absl::GetFlag(FLAGS_steps);
  o.checkpoint_every = absl::GetFlag(FLAGS_checkpoint_every);
  o.restore = absl::GetFlag(FLAGS_restore);
  o.restore_force = absl::GetFlag(FLAGS_restore_force);
  o.metrics_out = absl::GetFlag(FLAGS_metrics_out);
  o.blas_threads = absl::GetFlag(FLAGS_blas_threads);
  o.device = absl::GetFlag(FLAGS_device);
  o.gpu = absl::GetFlag(FLAGS_gpu);
  o.deterministic = absl::GetFlag(FLAGS_deterministic);

  std::unique_ptr<OffloadServer> embedded;
  if (o.servers.empty()) {
    ServerOptions server_options;
    server_options.listen = "";  // in-process only: no socket
    server_options.checkpoint_dir = absl::GetFlag(FLAGS_checkpoint_dir);
    server_options.auth_token = o.auth_token;
    auto server = OffloadServer::Start(server_options);
    if (!server.ok()) return server.status();
    embedded = std::move(*server);
    o.channels = {embedded->InProcessChannel()};
    o.routes = {embedded->DataRoute()};
  } else if (!absl::GetFlag(FLAGS_checkpoint_dir).empty()) {
    return absl::InvalidArgumentError(
        "--checkpoint-dir is for the embedded server; remote servers take their own "
        "--checkpoint-dir");
  }
  // The endpoint, declared after, stops answering before the metrics go.
  std::shared_ptr<train::TrainMetrics> metrics;
  std::unique_ptr<MetricsEndpoint> metrics_endpoint;
  if (const std::string listen = absl::GetFlag(FLAGS_metrics_listen); !listen.empty()) {
    metrics = std::make_shared<train::TrainMetrics>(
        o.job, o.stage >= 0 ? absl::StrCat(o.stage) : "all", o.dp_rank);
    auto endpoint = MetricsEndpoint::Start(listen, {metrics});
    if (!endpoint.ok()) return endpoint.status();
    metrics_endpoint = *std::move(endpoint);
    o.metrics = metrics.get();
    std::fprintf(o.out, "zo-train: metrics at %s\n", metrics_endpoint->url().c_str());
    std::fflush(o.out);
  }
  absl::Status trained = train::Train(o);
  if (embedded) embedded->Shutdown(absl::Seconds(1));
  return trained;
}

}  // namespace
}  // namespace zo

int main(int argc, char** argv) {
  zo::TuneMallocForBulkMessages();
  std::vector<std::string> storage;
  zo::ParseFlags(argc, argv, zo::Usage(), "worker/train/zo_train_main.cc", storage);
  absl::Status status = zo::Run();
  if (!status.ok()) {
    std::cerr << "zo-train: " << status.message() << "\n";
    return 1;
  }
  return 0;
}
