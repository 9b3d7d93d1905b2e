// The worker's side of the offload service (docs/architecture.md, "One training step"):
// open or attach to a job on every server, push each step's low-precision
// gradients as they become final, pull the weights of a version.
//
//   ZO_ASSIGN_OR_RETURN(auto client, OffloadClient::Open(options, config_json, manifest));
//   for (int64_t step = client->version() + 1; ...; ++step) {
//     ZO_RETURN_IF_ERROR(client->PullForStep(step, tensors, weights).status());  // DPU inside
//     ... forward/backward; as each gradient bucket is final:
//     ZO_RETURN_IF_ERROR(client->Push(step, tensor, grad_bytes));       // returns once queued
//     ZO_RETURN_IF_ERROR(client->FinishStep(step));                     // every piece acknowledged
//   }
//
// The same API runs against remote servers over gRPC and against an
// in-process server (ClientOptions::channels, e.g. grpc::Server::InProcessChannel),
// whose data may take the in-process route (ClientOptions::routes).
#ifndef ZO_WORKER_CLIENT_OFFLOAD_CLIENT_H_
#define ZO_WORKER_CLIENT_OFFLOAD_CLIENT_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/config.h"
#include "common/dpu_compensation.h"
#include "common/dpu_policy.h"
#include "common/sharding.h"
#include "proto/zo/v1/checkpoint.pb.h"
#include "proto/zo/v1/job.pb.h"

namespace grpc {
class Channel;
}

namespace zo {

class InProcessRoute;

namespace client_internal {
class CallGroup;
}

// Lets one thread give up another's Pull: Cancel() ends the pulls handed
// this object, those in flight and any started later, with CANCELLED (a
// prefetch for a step that will not run, a worker tearing down while its
// prefetch waits for a version only its own pushes would make).
// Thread-safe.
class PullCancellation {
 public:
  PullCancellation();
  ~PullCancellation();
  void Cancel();
  bool cancelled() const;

  PullCancellation(const PullCancellation&) = delete;
  PullCancellation& operator=(const PullCancellation&) = delete;

 private:
  friend class OffloadClient;
  std::unique_ptr<client_internal::CallGroup> group_;
};

struct ClientOptions {
  std::string job;
  // Every server of the job as "host:port", in striping order. Ignored when
  // `channels` is given. The client opens the config's
  // zo.connections_per_server TCP connections to each (those whose data
  // takes gRPC use them all; the others only the first).
  std::vector<std::string> servers;
  // Ready channels, one per server in striping order (the embedded default
  // passes one in-process channel). Non-empty: used instead of `servers`.
  std::vector<std::shared_ptr<grpc::Channel>> channels;
  // With `channels`: per server, the in-process route of the data plane
  // (OffloadServer::DataRoute()), which then carries the pushes and pulls
  // without gRPC; the channels carry the rest. Empty: the channels carry
  // everything.
  std::vector<std::shared_ptr<InProcessRoute>> routes;
  // Sent as `authorization: Bearer <token>` on every call; empty: none.
  std::string auth_token;
  // PEM root certificates: non-empty means TLS to `servers`.
  std::string tls_root_certs;
  int dp_rank = 0;
  int dp_world_size = 1;
  // Gradient bytes copied by Push and not yet written to a socket; Push
  // blocks while more are in flight.
  int64_t max_bytes_in_flight = int64_t{64} << 20;
  // Payload bytes per GradientPiece message.
  int64_t max_piece_bytes = int64_t{1} << 20;
  // Deadline of each unary call and of each Pull.
  absl::Duration call_timeout = absl::Seconds(120);
  // UNAVAILABLE and DEADLINE_EXCEEDED are retried with exponential backoff
  // (50 ms doubling to 2 s) for at most this long after the first failure
  // (a pull that waited long for its version and then failed is retried
  // too); other errors surface at once with the server's message.
  absl::Duration retry_for = absl::Seconds(10);
  // The same for Open's OpenJob calls; unset: retry_for. A caller that
  // tries Open again itself (zo-train's attach loops, zo.torch's follow())
  // sets it short, so that its own loop keeps the pace: its progress
  // notes, its decisions (a lead lost for 2 s is restored), its polls every
  // 500 ms, rather than one try's backoff of up to 2 s for up to 10 s.
  std::optional<absl::Duration> open_retry_for;
  // Re-sending a step after a restart: elements the servers already have
  // from this dp rank are skipped instead of rejected.
  bool resend = false;
  // Only attach to a job the servers have (a worker following a job that
  // moved): NOT_FOUND, or where the job went, instead of creating it.
  bool attach_only = false;
  // Servers given by address that run on this host (and can map this
  // process's memory) get the same-host route: gradients and weights go
  // through a shared-memory region, gRPC carries only the pieces' headers.
  // false, or a server that cannot: gRPC carries everything.
  bool shared_memory = true;
  // A server's region holds 3 x its share of the job in the job's dtype
  // (two steps of gradients and the weights), all of it touched each step:
  // a job whose region would be larger than this (RAM the servers on the
  // host may need) stays on gRPC, whose bytes in flight are bounded.
  int64_t max_region_bytes = int64_t{4} << 30;
  // OpenJobRequest.init_fingerprint: a hash of the manifest and initial
  // weights this worker would start the job from; 0: none.
  uint64_t init_fingerprint = 0;
  // The worker moves each delayed step's weights by StepCompensation
  // (zo.dpu.compensation "worker"); false: Open refuses such a config, so a
  // worker that does not apply it never trains without it.
  bool applies_dpu_compensation = false;
};

// One GradientPiece's worth of a Push: which server, chunk and bytes.
struct PushPiece {
  int server = 0;
  int64_t chunk = 0;
  int64_t chunk_offset = 0;  // elements
  int64_t byte_begin = 0;    // into the pushed span
  int64_t byte_end = 0;
  friend bool operator==(const PushPiece&, const PushPiece&) = default;
};

// How Push cuts elements [offset, offset + elems) of tensor `tensor` into
// pieces of at most max_piece_bytes (a multiple of the element size), each
// inside one chunk. Pure; exposed for tests.
std::vector<PushPiece> PlanPush(const ShardMap& map, int tensor, int64_t offset, int64_t elems,
                                int64_t elem_bytes, int64_t max_piece_bytes);

// Thread-safe: Push may be called from several threads (e.g. one per
// gradient bucket); FinishStep and Pull from any.
class OffloadClient {
 public:
  // Parses `config_json` (ParseConfig, with dp_world_size), checks that every
  // tensor has the job's dtype (fp16 with fp16.enabled, bf16 with
  // bf16.enabled, fp32 otherwise), connects, and sends OpenJob to every
  // server. The job's version and loss scale come from the lead's reply.
  // When a server opened the job fresh while another holds it trained (a
  // restarted server), Open succeeds but InitParams, pushes, FinishStep
  // and pulls fail with FAILED_PRECONDITION naming that server until
  // Restore succeeds.
  static absl::StatusOr<std::unique_ptr<OffloadClient>> Open(const ClientOptions& options,
                                                             const std::string& config_json,
                                                             std::vector<TensorSpec> manifest);
  ~OffloadClient();  // finishes open pushes (errors are logged) and joins threads

  const ShardMap& shard_map() const;
  const Config& config() const;

  // Sets the initial fp32 weights of tensor `tensor` on the servers that own
  // it (accepted only while the job is at version 0; the master starts from
  // them and version 0's low-precision copy is their rounding). Synchronous.
  absl::Status InitParams(int tensor, absl::Span<const float> values);

  // Queues the gradient of a whole tensor (its elements in the job's dtype)
  // for `step`: copies the bytes and returns, blocking only while more than
  // max_bytes_in_flight are queued. INVALID_ARGUMENT for a wrong size or
  // tensor index; an error of an earlier push of the same step surfaces here
  // or at FinishStep.
  absl::Status Push(int64_t step, int tensor, absl::Span<const std::byte> data);
  // Push without the copy: the pieces point into `data`, which must stay
  // valid and unchanged while `owner` lives; the client holds a reference to
  // `owner` until gRPC has written the last byte (a staging buffer handed
  // over, e.g. a std::shared_ptr<std::vector<std::byte>>). With
  // zo.gradient_accumulation "servers", `micro_batch` says which of the
  // step's micro-batches the gradient is from (each is pushed once).
  absl::Status PushShared(int64_t step, int tensor, std::shared_ptr<const void> owner,
                          absl::Span<const std::byte> data, int micro_batch = 0);
  // PushShared whose bytes an in-process server may read where they are
  // rather than copy them, until its update of `step` has read them: it
  // keeps `owner` until then. The caller leaves the bytes unchanged until
  // it has pulled the step's version (after a failed step: until the job is
  // restored or closed). With a delayed update (zo.dpu), whose next step may
  // write them sooner, it is PushShared. On the same-host route every push
  // is read in place: the server reads the region's copy
  // (GradientPiece.region_lent), and the client writes that area again, for
  // step + 2, only once a pull has shown the step's update over (until
  // then step + 2's pieces take gRPC and PushBuffers lends nothing).
  absl::Status PushLent(int64_t step, int tensor, std::shared_ptr<const void> owner,
                        absl::Span<const std::byte> data);
  // The same for elements [offset, offset + data.size() / elem size) of a tensor.
  absl::Status PushRange(int64_t step, int tensor, int64_t offset,
                         absl::Span<const std::byte> data);

  // With zo.client_lr: the learning rate of every parameter group for
  // `step`, sent to the lead (synchronously) before the step's first Push,
  // so that the step uses them. INVALID_ARGUMENT for the wrong count, a
  // negative or non-finite rate, or rates another dp rank contradicts;
  // FAILED_PRECONDITION for a job without zo.client_lr. `group_hyper`,
  // empty (the job's own) or one per group: each group's betas, eps and
  // weight decay for the step (Adam and AdamW jobs without
  // zo.dpu.compensation; the rules of zo.param_groups).
  absl::Status SetStepLr(int64_t step, absl::Span<const double> group_lr,
                         absl::Span<const ParamGroupConfig> group_hyper = {});
  // zo.dpu.compensation "worker": once the lead has decided `step` (the call
  // waits for it), per manifest tensor the coefficients by which a worker
  // that holds `step`'s gradient moves the version it pulled for step + 1
  // (common/dpu_compensation.h); `have_before`: it also holds the version
  // before that one. FAILED_PRECONDITION for a job without it.
  absl::StatusOr<std::vector<WeightsCompensation>> StepCompensation(int64_t step, bool have_before);

  // Waits until every piece pushed for `step` is written and every server's
  // stream for it has answered; returns the first error (with the server
  // address and its message).
  absl::Status FinishStep(int64_t step);

  // Pulls version `version` of `tensors` (manifest indices) into `dst`
  // (dst[i] is tensor i's full size in the job's dtype), waiting on the
  // servers until it exists. Returns false, leaving dst untouched, when the
  // weights equal those of `have_version` (only skipped steps between).
  // After an error dst may hold part of the version. `cancel` (may be null)
  // ends the wait from another thread. Through an embedded server's
  // in-process route, a pull of some of the job's tensors returns as soon
  // as their weights are written, which may be before the version is the
  // job's (JobStatus may still show the one before): a forward can start
  // on its first layers while the servers write the last ones. A pull of
  // every tensor returns once the version is the job's.
  absl::StatusOr<bool> Pull(int64_t version, int64_t have_version, absl::Span<const int> tensors,
                            absl::Span<const absl::Span<std::byte>> dst,
                            PullCancellation* cancel = nullptr);

  // Pulls VersionForStep(config.zo.dpu, step, base version)
  // (common/dpu_policy.h) into dst unless dst already holds its weights (the
  // client remembers the version last pulled by this method). Returns whether
  // dst changed, so a caller copies weights to the device only when they did.
  // `loss_scale`, when given, receives the loss scale of the steps computed
  // on that version: the one `step`'s loss is multiplied by (loss_scale()
  // may already be a later step's under DPU). After an error the client
  // forgets what dst holds: the next call pulls its version whole.
  absl::StatusOr<bool> PullForStep(int64_t step, absl::Span<const int> tensors,
                                   absl::Span<const absl::Span<std::byte>> dst,
                                   double* loss_scale = nullptr,
                                   PullCancellation* cancel = nullptr);

  // The version the last PullForStep or PullForStepInBatches brought or
  // found unchanged; -1 before the first and after a failed one.
  int64_t last_pulled_version() const;

  // PullForStep through a bounded buffer (a streamed stage whose weights
  // live in a file): the batches are pulled one after another, each into
  // its own dst, and `pulled(b)` (may be null) is called once batch b is
  // there, before the next is pulled, so the batches' dst may share memory.
  // When the version is unchanged nothing is pulled and `pulled` is not
  // called. An error from `pulled` ends the pull with it. `loss_scale` is
  // written before the first `pulled` call.
  struct PullBatch {
    absl::Span<const int> tensors;
    absl::Span<const absl::Span<std::byte>> dst;
  };
  absl::StatusOr<bool> PullForStepInBatches(int64_t step, absl::Span<const PullBatch> batches,
                                            const std::function<absl::Status(size_t batch)>& pulled,
                                            double* loss_scale = nullptr,
                                            PullCancellation* cancel = nullptr);

  // PullForStep with the tensors cut into batches that are all pulled at
  // once (their dst must not overlap): `arrived(b)` runs as soon as batch b
  // is there, on the batch's own thread, so in any order and possibly for
  // several at once. Through the in-process route the servers answer a
  // batch of some of the job's tensors as soon as they have written it
  // (Pull): a forward can start on its first layers' batch while the
  // servers still write the last ones, and since every batch registers
  // at once, an update or a speculation writes each straight into its dst.
  // When the version is unchanged nothing is pulled and `arrived` is not
  // called; an error from `arrived` ends the pull with it. `loss_scale` is
  // written before the first `arrived` call. `registered` (may be null)
  // runs once, as soon as every batch is registered where its servers
  // write it (or its call has begun, off the in-process route), or the
  // pull ended: a caller that waits for it knows that gradients pushed
  // from then on make weights written straight into dst.
  absl::StatusOr<bool> PullForStepAsWritten(
      int64_t step, absl::Span<const PullBatch> batches,
      const std::function<absl::Status(size_t batch)>& arrived,
      const std::function<void()>& registered = nullptr, double* loss_scale = nullptr,
      PullCancellation* cancel = nullptr);

  // Bytes queued by the pushes and written into dst by the pulls so far
  // (the payload, not the wire framing): for metrics.
  struct Traffic {
    int64_t pushed_bytes = 0;
    int64_t pulled_bytes = 0;
    // Of pushed_bytes, those pushed from where their server reads them
    // (PushBuffers), which the push did not copy.
    int64_t pushed_in_place_bytes = 0;
  };
  Traffic traffic() const;

  // The same-host route: one buffer per tensor of `tensors`, inside the
  // shared region its server writes pulled weights into, to give Pull and
  // PullForStep as dst: a pull into them copies nothing more. Empty when
  // some tensor has no such place (gRPC or the in-process route carries its
  // server's weights, or several servers hold parts of it). Valid while the
  // client lives, or with `keeper` while *keeper does (it keeps their
  // regions mapped, so a caller's tensors may live there: zo.torch's
  // parameters); they change only with pulls into them: from now on a pull
  // into other buffers takes gRPC for their servers.
  std::vector<absl::Span<std::byte>> RegionPullBuffers(
      absl::Span<const int> tensors, std::shared_ptr<const void>* keeper = nullptr);
  // The other direction: one buffer per tensor of `tensors`, where its
  // server reads the tensor's gradient of step `step` (its place in the
  // step's gradient area of the shared region; for an embedded server on
  // the in-process route, its place in the server's own buffer), to write
  // the gradient into (a backward's device-to-host copy) and then give
  // Push or PushShared: the push copies nothing more. On the same-host
  // route it waits, as such a push would before its copy, until the step
  // two before, which used the same area, has all its pieces summed.
  // Empty where some tensor has no such place: several servers hold parts
  // of it, gRPC carries its server's gradients, its embedded server sums
  // several contributors or still updates the step before, its server may
  // still read the area (no pull since its step two before: PushLent); and with
  // micro-batches summed on the servers (each one's copy waits for the one
  // before to be summed). Lent until FinishStep(step): a push of one of
  // these tensors in that step from other bytes takes gRPC on the
  // same-host route (nothing else writes the lent bytes there).
  // FAILED_PRECONDITION while places in a region lent for step - 2 or
  // earlier are not finished, or at the deadline of that wait. With
  // `keeper`, only places in shared regions are lent (empty where some
  // tensor's would be an embedded server's buffer), and *keeper keeps their
  // regions mapped as RegionPullBuffers' does: zo.torch's engine keeps its
  // parameters' .grad there.
  absl::StatusOr<std::vector<absl::Span<std::byte>>> PushBuffers(
      int64_t step, absl::Span<const int> tensors, std::shared_ptr<const void>* keeper = nullptr);

  // Per server, the route its gradients and weights take: "in_process",
  // "shared_memory" or "grpc".
  std::vector<std::string> routes() const;

  // FAILED_PRECONDITION while a server of the job lost its part (it
  // restarted empty; Open found it so) and the job was not restored since.
  absl::Status CheckState() const;

  // Loss scale for the step after the latest version seen (from the last
  // pull, open or status).
  double loss_scale() const;
  // Latest version seen.
  int64_t version() const;

  // The lead server's status of the job (refreshes loss_scale and version).
  absl::StatusOr<v1::JobStatus> JobStatus();
  // Asks the lead to checkpoint the job at its current version, or once it
  // reaches `min_version` (a step just pushed); returns the committed directory.
  absl::StatusOr<std::string> Checkpoint(int64_t min_version = 0);
  // Asks the lead to restore the job from `path` (empty: its latest
  // checkpoint); returns the restored version.
  // `rollback` (after a server lost its part): every other client of the
  // job must reopen it; this one follows by itself.
  absl::StatusOr<int64_t> Restore(const std::string& path, bool rollback = false);
  // Restore (no rollback), but only while the lead has finished
  // `seen_restores` restores of the job (JobStatus.restores as the caller
  // read it before deciding): of callers that decided at the same time that
  // the job needs one, the first restores it and the others get
  // already_restored with the version the job is at.
  absl::StatusOr<v1::RestoreResponse> RestoreOnce(const std::string& path, int64_t seen_restores);

  OffloadClient(const OffloadClient&) = delete;
  OffloadClient& operator=(const OffloadClient&) = delete;

 private:
  struct Impl;
  explicit OffloadClient(std::unique_ptr<Impl> impl);
  // Restore's and RestoreOnce's call; takes on the job's version after it.
  absl::StatusOr<v1::RestoreResponse> RestoreCall(const v1::RestoreRequest& request);
  std::unique_ptr<Impl> impl_;
};

}  // namespace zo

#endif  // ZO_WORKER_CLIENT_OFFLOAD_CLIENT_H_
