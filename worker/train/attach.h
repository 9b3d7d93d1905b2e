// This process's pipeline stages attached to a job: each stage's offload
// client(s), link, module and executor, and the transport between the
// stages (threads of this process, or TCP to the other stages' processes).
// Attaching waits for servers that are not up yet, and for a job that moved
// to arrive where it went.
#ifndef ZO_WORKER_TRAIN_ATTACH_H_
#define ZO_WORKER_TRAIN_ATTACH_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "rpc/job_move.h"
#include "worker/backend/backend.h"
#include "worker/client/offload_client.h"
#include "worker/model/model.h"
#include "worker/model/model_stage.h"
#include "worker/pipeline/executor.h"
#include "worker/pipeline/in_process_transport.h"
#include "worker/pipeline/tcp_transport.h"
#include "worker/train/offload_link.h"
#include "worker/train/plan.h"
#include "worker/train/progress.h"
#include "worker/train/trainer.h"

namespace zo::train {

// One stage of this process: its client(s), link, module and executor.
struct LocalStage {
  int stage = 0;
  std::unique_ptr<OffloadClient> client;
  std::unique_ptr<OffloadClient> resend_client;  // the first step after a restart
  std::unique_ptr<OffloadLink> link;
  std::unique_ptr<model::ModelStage> module;
  std::unique_ptr<pipeline::Executor> executor;
};

// The stages this process runs, attached to the job, with their transport.
// Destroyed in reverse: executors before modules before links before clients.
// The plan, backend and batch source it was attached with must outlive it.
struct Attached {
  std::unique_ptr<pipeline::InProcessFabric> fabric;
  std::unique_ptr<pipeline::TcpTransport> tcp;
  std::vector<LocalStage> local;
};

// What every offload client of the run is opened with, from its options.
ClientOptions MakeClientOptions(const TrainOptions& o);

// The first attach. Servers that cannot be reached yet (a host restarting,
// a Kubernetes pod not ready, a lead killed a moment ago) are waited for,
// saying so at once and every 10 s, for at most 5 minutes; any other error
// ends it.
absl::StatusOr<Attached> AttachAtStart(const TrainOptions& o, Plan& plan, backend::Backend& backend,
                                       model::BatchSource& source);

// Attaches to a job that moved, once it is there at the version the move
// named (FollowJob), noting the wait to `progress`. A lead that restarted
// without the job gets it back from one worker (dp rank 0 with stage 0),
// which restores the latest checkpoint.
absl::StatusOr<Attached> Reattach(const TrainOptions& o, Plan& plan, backend::Backend& backend,
                                  model::BatchSource& source, const JobMove& move,
                                  Progress& progress);

// A server said it does not hold job `job`; `server`: that server only.
bool NoJobOn(const absl::Status& failed, const std::string& job, const std::string& server = "");

}  // namespace zo::train

#endif  // ZO_WORKER_TRAIN_ATTACH_H_
