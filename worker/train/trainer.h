// zo-train's training loop: builds the model, cuts it into pipeline stages,
// opens one offload client per local stage, and runs the stages' programs
// step by step, as threads of this process (the in-process transport) or as
// this process's one stage of a multi-process pipeline (TCP).
//
// Steps are numbered from 1; `steps` is the last one. A worker that joins a
// job that has trained (a restart) starts at the servers' version + 1 and
// re-sends that step, so a killed worker picks up where the servers are.
#ifndef ZO_WORKER_TRAIN_TRAINER_H_
#define ZO_WORKER_TRAIN_TRAINER_H_

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "worker/model/model.h"

namespace grpc {
class Channel;
}

namespace zo {
class InProcessRoute;
}  // namespace zo

namespace zo::train {

class TrainMetrics;

struct TrainOptions {
  std::string config_json;    // DeepSpeed-style config
  std::string model = "gpt";  // gpt | mlp
  model::GptConfig gpt;       // vocab comes from the data
  model::MlpConfig mlp;
  std::string data_path;  // empty: synthetic text (GPT)
  uint64_t seed = 1337;   // data order and initial weights

  int pipeline_stages = 1;
  int stage = -1;  // >= 0: run only this stage; the others are other processes
  std::vector<std::string> stage_addresses;  // "host:port" per stage, for TCP
  std::string schedule = "1f1b";             // gpipe | 1f1b | interleaved
  int virtual_chunks = 1;                    // interleaved: chunks per stage
  std::string partition_method = "parameters";
  int activation_checkpoint_every = 0;  // layers; 0: off
  // Bytes of device memory per device, > 0: each stage streams its weights
  // through a window planned to keep its step within them
  // (model/device_memory_plan.h); 0: no budget.
  int64_t device_memory_budget = 0;

  // Offload servers, "host:port" in striping order; empty: `channels`.
  std::vector<std::string> servers;
  std::vector<std::shared_ptr<grpc::Channel>> channels;  // the embedded server
  // With `channels`: the embedded server's data route (ClientOptions::routes).
  std::vector<std::shared_ptr<InProcessRoute>> routes;
  std::string job = "zo-train";
  std::string auth_token;
  std::string tls_root_certs;
  int dp_rank = 0;
  int dp_world_size = 1;

  int64_t steps = 100;
  int64_t checkpoint_every = 0;  // steps; 0: never
  // Before training, restore the job from a checkpoint: "latest" (the
  // servers' newest of this job) or a checkpoint directory; empty: no.
  std::string restore;
  // Let --restore roll back a job that went on past the checkpoint (without
  // it, such a restore is refused).
  bool restore_force = false;
  std::string metrics_out;
  // Each step is recorded here too when set (the --metrics-listen endpoint).
  TrainMetrics* metrics = nullptr;
  int blas_threads = 0;
  std::string device = "auto";  // auto | cuda | cpu (backend/select_backend.h)
  int gpu = 0;
  bool deterministic = false;
  std::FILE* out = stdout;
};

// Trains until the job's version reaches options.steps. Errors name what
// failed: a bad flag combination, a config the servers refuse, a stage that
// died (with its step and instruction).
absl::Status Train(const TrainOptions& options);

}  // namespace zo::train

#endif  // ZO_WORKER_TRAIN_TRAINER_H_
