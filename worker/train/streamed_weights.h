// Where a stage that streams its parameters (zero_optimization.offload_param)
// keeps its 16-bit weights between the servers and its window
// (docs/architecture.md, "Parameter streaming"). Each step: Pull, then
// Weights for the window. One of three, by KindFor:
//
//   kServers   every server in this process or on this host: no copy here.
//              Pull fetches the step's smallest tensor, which waits for the
//              version and brings its loss scale and whether it changed;
//              the window then pulls each layer it uploads into a slot.
//   kHostCopy  a server reached over gRPC: Pull fetches the stage whole
//              into page-locked host memory, the window uploads from there.
//   kFile      offload_param "nvme": Pull fetches the stage batch by batch
//              through one buffer of buffer_size parameters into a file
//              (weight_file.h); the window reads a layer at a time.
//
// The window's reads go into two page-locked slots as large as the largest
// layer (slot 0 for Fetch, slot 1 for the prefetch, which reads on the
// window's own thread; param_window.h).
#ifndef ZO_WORKER_TRAIN_STREAMED_WEIGHTS_H_
#define ZO_WORKER_TRAIN_STREAMED_WEIGHTS_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "offload/io/io_engine.h"
#include "worker/backend/backend.h"
#include "worker/client/offload_client.h"
#include "worker/model/model_stage.h"

namespace zo::train {

// offload_param "nvme": the file's directory, its engine, and the pull's
// buffer in parameters.
struct WeightFileOptions {
  std::string dir;
  IoEngineOptions io;
  int64_t buffer_elems = 100'000'000;
};

class StreamedWeights {
 public:
  enum class Kind { kServers, kHostCopy, kFile };
  // kFile with a file; else kServers when no route is "grpc"
  // (OffloadClient::routes), else kHostCopy.
  static Kind KindFor(const std::vector<std::string>& routes, bool file);

  // Runs a pull with a cancellation the caller registers (StepAbort), and
  // says why it failed when the step was aborted.
  using PullGuard = std::function<absl::StatusOr<bool>(
      const std::function<absl::StatusOr<bool>(PullCancellation*)>& pull)>;

  struct Stage {
    backend::Backend* backend = nullptr;  // borrowed; AllocateHost
    DType dtype = DType::kFloat16;
    std::vector<model::Param*> params;  // the stage's, in order
    std::vector<int> tensors;           // each param's manifest index
    PullGuard guard;
  };
  // INVALID_ARGUMENT naming the param when one outgrows the file's buffer;
  // the file's errors (weight_file.h).
  static absl::StatusOr<std::unique_ptr<StreamedWeights>> Create(Kind kind, Stage stage,
                                                                 const WeightFileOptions& file);

  virtual ~StreamedWeights() = default;
  virtual Kind kind() const = 0;

  // Pulls `step`'s weights through `client` as this kind keeps them;
  // whether they changed since the last Pull; the version's loss scale
  // into *loss_scale.
  virtual absl::StatusOr<bool> Pull(OffloadClient& client, int64_t step, double* loss_scale) = 0;
  // What the window reads the weights of the last Pull from, with
  // `changed` as it said.
  virtual model::HostWeights Weights(bool changed) = 0;
  // Host memory held (page-locked where the backend has it).
  virtual int64_t host_bytes() const = 0;

 protected:
  explicit StreamedWeights(Stage stage) : stage_(std::move(stage)) {}
  const Stage stage_;
};

}  // namespace zo::train

#endif  // ZO_WORKER_TRAIN_STREAMED_WEIGHTS_H_
