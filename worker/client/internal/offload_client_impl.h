// OffloadClient's state, shared by the files that define its methods
// (offload_client.cc and offload_client_{open,push,region,pull,job}.cc,
// one concern each). Internal to worker/client.
#ifndef ZO_WORKER_CLIENT_INTERNAL_OFFLOAD_CLIENT_IMPL_H_
#define ZO_WORKER_CLIENT_INTERNAL_OFFLOAD_CLIENT_IMPL_H_

#include <algorithm>
#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/config.h"
#include "common/cpu_features.h"
#include "common/dtype.h"
#include "common/sharding.h"
#include "grpcpp/channel.h"
#include "proto/zo/v1/offload_service.grpc.pb.h"
#include "rpc/rpc_util.h"
#include "worker/client/internal/byte_budget.h"
#include "worker/client/internal/call.h"
#include "worker/client/internal/pull_receiver.h"
#include "worker/client/internal/push_call.h"
#include "worker/client/internal/region_credits.h"
#include "worker/client/internal/worker_region.h"
#include "worker/client/offload_client.h"

namespace zo {

namespace client_internal {

// Over the in-process and same-host routes a push's pieces are copied by up
// to kMaxCopyThreads threads (no more than the cores), a piece cut into parts
// of at least kLocalPartBytes.
inline constexpr int64_t kMaxCopyThreads = 4;
inline constexpr int64_t kLocalPartBytes = int64_t{4} << 20;

inline int64_t CopyThreads() { return std::min<int64_t>(HostThreads(), kMaxCopyThreads); }

}  // namespace client_internal

// Members fixed at Open are const; the open push calls, the job's state and
// what PullForStep last pulled each have their own mutex, so a Push never
// waits on a Pull. Lock order: pull_for_step_mu before state_mu; mu before a
// PushStream's own.
struct OffloadClient::Impl {
  Impl(const ClientOptions& options_in, Config config_in, DType dtype_in, ShardMap map_in,
       std::vector<std::string> names_in, std::vector<std::shared_ptr<grpc::Channel>> channels_in,
       std::vector<std::vector<std::shared_ptr<grpc::Channel>>> more_channels_in,
       std::vector<std::shared_ptr<InProcessRoute>> routes_in)
      : options(options_in),
        call{.attempt = {.timeout = options_in.call_timeout, .auth_token = options_in.auth_token},
             .retry_for = options_in.retry_for},
        config(std::move(config_in)),
        dtype(dtype_in),
        elem_bytes(static_cast<int64_t>(DTypeSize(dtype_in))),
        map(std::move(map_in)),
        names(std::move(names_in)),
        channels(std::move(channels_in)),
        routes(std::move(routes_in)),
        budget(options_in.max_bytes_in_flight) {
    routes.resize(channels.size());
    for (const auto& channel : channels) stubs.push_back(v1::Offload::NewStub(channel));
    more_channels_in.resize(channels.size());
    data_stubs.resize(channels.size());
    for (size_t s = 0; s < channels.size(); ++s) {
      data_channels.push_back({channels[s]});
      for (auto& c : more_channels_in[s]) data_channels[s].push_back(std::move(c));
      for (const auto& c : data_channels[s]) data_stubs[s].push_back(v1::Offload::NewStub(c));
    }
    pull_stripes = std::make_unique<std::atomic<bool>[]>(channels.size());
  }

  ~Impl();

  std::atomic<int64_t> pushed_bytes{0};
  std::atomic<int64_t> pulled_bytes{0};
  std::atomic<int64_t> pushed_in_place_bytes{0};
  // Per server, the instance of the job it opened (JobStatus.incarnation):
  // sent with every push and pull, so a server that has since reopened or
  // restored the job refuses them rather than mixing steps or layouts. Set
  // in Open and after this client's own Restore.
  std::unique_ptr<std::atomic<uint64_t>[]> incarnation;

  absl::Duration call_timeout() const { return call.attempt.timeout; }
  // A unary call to server `server` with retries; `call` makes one attempt.
  // `group` (may be null) cancels it.
  template <typename Response, typename Call>
  absl::StatusOr<Response> Unary(int server, Call call,
                                 client_internal::CallGroup* group = nullptr) {
    return Unary<Response>(this->call, server, std::move(call), group);
  }
  // The same, retrying as `settings` say.
  template <typename Response, typename Call>
  absl::StatusOr<Response> Unary(const client_internal::CallSettings& settings, int server,
                                 Call call, client_internal::CallGroup* group);
  // Whether every server is still on the instance of the job its OpenJob
  // answered with, and the lead is not restoring it.
  absl::StatusOr<bool> SameInstanceAsOpened(const std::vector<v1::OpenJobResponse>& replies);
  // Open's OpenJob on every server, again while the job is restored
  // meanwhile (SameInstanceAsOpened); UNAVAILABLE once it has tried enough.
  absl::StatusOr<std::vector<v1::OpenJobResponse>> OpenJob(const std::string& config_json,
                                                           const v1::Manifest& manifest);
  // One round of OpenJob, every server's answer in `replies` (one each).
  absl::Status OpenJobOnEveryServer(const std::string& config_json, const v1::Manifest& manifest,
                                    std::vector<v1::OpenJobResponse>& replies);
  // Takes on the state the servers opened the job with, attaches the
  // same-host route and logs what was opened. Open's, before any other
  // thread can see this client.
  void TakeOnOpened(const std::vector<v1::OpenJobResponse>& replies);
  // Sets lost_state (and logs it) when a server opened the job fresh while
  // another holds it trained.
  void RefuseStepsIfStateLost(const std::vector<v1::OpenJobResponse>& replies);

  // FAILED_PRECONDITION naming the server that lost the job's state, while
  // one did.
  absl::Status CheckState() {
    std::lock_guard lock(state_mu);
    if (lost_state.empty()) return absl::OkStatus();
    return absl::FailedPreconditionError(lost_state);
  }

  // INVALID_ARGUMENT unless `tensor` is a manifest index.
  absl::Status CheckTensorIndex(int tensor) const {
    if (tensor >= 0 && tensor < static_cast<int>(map.tensors().size())) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor index ", tensor, " is outside the manifest's ", map.tensors().size(), " tensors"));
  }
  std::string TensorLabel(int t) const {
    return absl::StrCat("tensor #", t, " '", map.tensors()[t].name, "'");
  }
  // The error of an earlier push of `step`, if one failed. Requires mu.
  absl::Status StepErrorLocked(int64_t step) const;
  // `owner` null: the bytes are copied; otherwise they are sent in place,
  // and with `lend` an in-process server may keep them (PushLent).
  absl::Status PushRange(int64_t step, int tensor, int64_t offset, absl::Span<const std::byte> data,
                         std::shared_ptr<const void> owner, int micro_batch = 0, bool lend = false);
  // PushRange's checks of its arguments: INVALID_ARGUMENT naming the first
  // that is wrong.
  absl::Status CheckPushRange(int64_t step, int tensor, int64_t offset, int64_t bytes,
                              int micro_batch) const;
  // The most bytes PlanPush puts in one piece of a push.
  int64_t MaxPushPieceBytes() const;
  // The header of push piece `p`: every field but its bytes and where they
  // lie.
  v1::GradientPiece PushHeader(int64_t step, const PushPiece& p, int micro_batch) const;
  // Push's check that `data` is the whole tensor.
  absl::Status CheckWholeTensor(int tensor, size_t bytes) const;
  absl::Status FinishStep(int64_t step);
  absl::Status InitParams(int tensor, absl::Span<const float> values);
  // One server's part of InitParams, retried (a range sent again overwrites).
  absl::Status InitParamsOn(int server, const std::vector<PushPiece>& pieces,
                            absl::Span<const float> values, client_internal::CallGroup& group);
  // `registered` (may be null) runs once, as soon as every server's part
  // is registered where its server writes it (the in-process route) or
  // has begun (the others), or the pull ended.
  absl::StatusOr<bool> Pull(int64_t version, int64_t have_version, absl::Span<const int> tensors,
                            absl::Span<const absl::Span<std::byte>> dst, double* loss_scale,
                            client_internal::CallGroup* cancel,
                            const std::function<void()>& registered = nullptr);
  // One server's part of a Pull (stripe `stripe` of `stripes`, over
  // connection `stripe`), retried; `registered` (may be null) runs when
  // its first attempt is registered or has begun, at most once.
  absl::Status PullFrom(int server, int stripe, int stripes, int64_t version, int64_t have_version,
                        client_internal::PullReceiver& receiver, client_internal::CallGroup& group,
                        const std::function<void()>& registered = nullptr);
  // The same over server `server`'s in-process route.
  absl::Status PullLocal(int server, const v1::PullParamsRequest& request,
                         client_internal::PullReceiver& receiver, client_internal::CallGroup& group,
                         const std::function<void()>& registered = nullptr);
  // Waits on the in-process route until the request's version exists, at
  // most until `deadline`; `group` cancels the wait.
  absl::Status AwaitLocalVersion(int server, const v1::PullParamsRequest& request,
                                 absl::Time deadline, client_internal::CallGroup& group);
  void SetStatus(const v1::JobStatus& status);
  // A pull that ran out of time may wait on a version the servers cannot
  // make, because the lead cannot reach another server: `error` with what
  // the lead says it is stuck on, so the message names the server at fault.
  absl::Status WithStuckPeer(absl::Status error);

  const ClientOptions options;
  const client_internal::CallSettings call;
  const Config config;
  const DType dtype;
  const int64_t elem_bytes;
  const ShardMap map;
  const std::vector<std::string> names;  // per server: its address, or "inproc:<i>"
  const std::vector<std::shared_ptr<grpc::Channel>> channels;
  // Per server: its in-process route, or null (the channel carries the
  // data). Fixed after construction.
  std::vector<std::shared_ptr<InProcessRoute>> routes;
  std::vector<std::unique_ptr<v1::Offload::Stub>> stubs;  // fixed after construction
  // Per server, the connections its gRPC pushes and pulls are striped
  // over (zo.connections_per_server): channels[server] first, then those
  // made for it alone. A chunk's pieces all take one of them (ConnectionOf),
  // so pieces that a server sums in order arrive in order. Fixed after
  // construction.
  std::vector<std::vector<std::shared_ptr<grpc::Channel>>> data_channels;
  std::vector<std::vector<std::unique_ptr<v1::Offload::Stub>>> data_stubs;
  int ConnectionOf(int server, int64_t chunk) const {
    return map.StripeOfChunk(chunk, static_cast<int>(data_channels[server].size()));
  }
  // Whether `server`'s gradients and weights go over gRPC (no in-process
  // route, no region).
  bool DataOverGrpc(int server) const { return routes[server] == nullptr && RegionId(server) == 0; }
  // Per server: it pulls stripes (OpenJobResponse.pull_stripes). Set at Open.
  std::unique_ptr<std::atomic<bool>[]> pull_stripes;
  // The stripes a gRPC pull from `server` is cut into: one per connection
  // where the server takes them and the data is not on another route.
  int PullStripes(int server) const {
    return DataOverGrpc(server) && pull_stripes[server].load(std::memory_order_relaxed)
               ? static_cast<int>(data_channels[server].size())
               : 1;
  }
  client_internal::ByteBudget budget;

  // The same-host route, per server: this worker's region and its id on
  // that server (0: gRPC carries the data). Set at Open (and again after a
  // rollback); an id drops to 0 when the server no longer knows it.
  // Shared: RegionPullBuffers' `keeper` may keep a region mapped after
  // the client is gone.
  std::vector<std::shared_ptr<client_internal::WorkerRegion>> regions;
  std::unique_ptr<std::atomic<uint64_t>[]> region_ids;
  // Per server: it takes GradientPiece.more_ranges (AttachRegionResponse).
  std::unique_ptr<std::atomic<bool>[]> region_batches;
  // One pull at a time writes a server's weights area.
  std::unique_ptr<std::mutex[]> region_pull_mu;
  // Per server: RegionPullBuffers lent bytes of its weights area, so only
  // pulls into those take the region.
  std::unique_ptr<std::atomic<bool>[]> region_lent;
  // Element `chunk_offset` of global chunk `chunk` in its server's local
  // order (the regions' areas, the server's state): the server's chunks,
  // all full but the job's last, one after another.
  int64_t LocalElement(int64_t chunk, int64_t chunk_offset) const {
    return (chunk / map.num_servers()) * map.chunk_elems() + chunk_offset;
  }
  // Tensor `tensor` in its server's local order, when one server holds the
  // whole tensor, its chunks one after another.
  struct LocalRun {
    int server = 0;
    int64_t first = 0;  // local element
    int64_t elems = 0;
  };
  std::optional<LocalRun> LocalRunOf(int tensor) const;
  // The same, when that server's gradients and weights take its region.
  std::optional<LocalRun> RegionRunOf(int tensor) const;
  // Where local element `local` of step `step`'s gradients lies in
  // `server`'s region.
  std::byte* GradientPlace(int64_t step, int server, int64_t local) const {
    const client_internal::WorkerRegion& r = *regions[server];
    return r.base() + r.GradientAreaOffset(step) + local * elem_bytes;
  }
  // Where tensor `tensor`'s pulled weights lie in its server's weights area,
  // with that server (RegionRunOf).
  std::optional<std::pair<int, absl::Span<std::byte>>> RegionPlace(int tensor) const;
  // Whether `receiver`'s buffers are all the places RegionPlace gives.
  bool PullsIntoRegionPlaces(const client_internal::PullReceiver& receiver) const;
  // With micro-batches summed on the servers, one push at a time writes a
  // server's gradient areas: pushes of two micro-batches may write the
  // same bytes, and the later must find the earlier's piece recorded (its
  // credit) before it writes.
  std::unique_ptr<std::mutex[]> region_push_mu;
  // Per server: which piece last wrote where in its gradient areas.
  // Guarded by mu.
  std::vector<client_internal::RegionCredits> region_credits;
  // Every piece through a region is the server's to read in place
  // (GradientPiece.region_lent) until its update of that step ends, so an
  // area is written again only once a pull has shown that. Per server: the
  // last step each gradient area (step % 2) carried, and the latest version
  // pulled from it (its update of every step up to it is over). Guarded by mu.
  std::vector<std::array<int64_t, 2>> region_area_step;
  std::vector<int64_t> pulled_through;
  // Whether `step` may write `server`'s gradient area: it already does, or
  // the step it last carried has been pulled since. A client's steps come
  // in order (FinishStep ends a step's pushes), so a step below one the
  // areas carried follows a restore, which ended every read of them and
  // left the job at version step - 1. Requires mu.
  bool RegionAreaFreeLocked(int server, int64_t step) {
    std::array<int64_t, 2>& area = region_area_step[server];
    if (step < std::max(area[0], area[1])) {
      area = {0, 0};
      pulled_through[server] = std::min(pulled_through[server], step - 1);
    }
    const int64_t last = area[step % 2];
    return last == step || last <= pulled_through[server];
  }
  // Makes the regions (first call) and attaches them to their servers; a
  // server that refuses gets gRPC, with a log line saying why.
  void AttachRegions();
  uint64_t RegionId(int server) const {
    return region_ids == nullptr ? 0 : region_ids[server].load(std::memory_order_relaxed);
  }
  // Whether gradients for `server` go through its region.
  bool GradientsThroughRegion(int server) const { return RegionId(server) != 0; }
  // The server no longer knows this worker's region: gRPC from now on.
  void DropRegion(int server, const absl::Status& why);
  // A piece for the same-host route: its bytes, where they go in the
  // region, and the header that names them.
  struct RegionPiece {
    int server = 0;
    v1::GradientPiece header;
    absl::Span<const std::byte> data;
    std::byte* dst = nullptr;
  };
  // Copies the pieces of `step` into their regions (once the step two
  // before, whose area they reuse, is in, and the server has summed the
  // pieces of this step whose bytes they overwrite), then sends their
  // headers. A piece already in its place (PushBuffers) is not copied.
  absl::Status PushThroughRegions(int64_t step, const std::vector<RegionPiece>& pieces);
  // Until the push calls of steps up to `step` - 2 to `servers` through
  // their regions have ended (every piece of them summed): FAILED_PRECONDITION
  // at `deadline`.
  absl::Status AwaitOlderRegionCalls(int64_t step, const std::set<int>& servers,
                                     absl::Time deadline);
  // By step, then tensor: where PushBuffers lent the tensor's gradient
  // place (in a region's gradient area or an embedded server's
  // accumulator); until FinishStep. A push of one of them from other bytes
  // into a region takes gRPC, so that only the lent bytes are written there.
  // Guarded by mu.
  std::map<int64_t, std::map<int, const std::byte*>> push_lent;
  // The in-process route: where tensor `tensor`'s gradient of `step` is
  // kept by its server (InProcessRoute::LendGradientPlace, chunk by chunk),
  // or an empty span when one in-process server cannot lend all of it.
  absl::StatusOr<absl::Span<std::byte>> LocalGradientPlace(int64_t step, int tensor);

  // A piece (or a part of one) for the in-process route.
  struct LocalPiece {
    std::shared_ptr<client_internal::PushCall> call;
    v1::GradientPiece header;
    absl::Span<const std::byte> data;
  };
  // A push's pieces for the in-process and same-host routes, handed over
  // once all are planned.
  struct RoutedPush {
    std::vector<LocalPiece> local;
    std::vector<RegionPiece> in_region;
  };
  // Sends piece `p` of `data` over gRPC, or adds it to `routed` for the
  // route that takes its server's pieces; `lend`: PushLent's (an
  // in-process server may keep the bytes). A region piece always says
  // region_lent, and goes over gRPC while its area may still be read
  // (RegionAreaFreeLocked).
  absl::Status RoutePushPiece(int64_t step, const PushPiece& p, v1::GradientPiece header,
                              absl::Span<const std::byte> data,
                              const std::shared_ptr<const void>& owner, bool in_place, bool lend,
                              RoutedPush& routed);
  // The in-process push call of `step` to `server`, made by its first piece.
  std::shared_ptr<client_internal::PushCall> LocalPushCallFor(int64_t step, int server);
  // Adds piece `p` to `local`, cut into parts for CopyThreads() (whole
  // when `in_place`: the server keeps it where it lies).
  void AddLocalParts(const std::shared_ptr<client_internal::PushCall>& call, const PushPiece& p,
                     const v1::GradientPiece& header, absl::Span<const std::byte> data,
                     bool in_place, std::vector<LocalPiece>& local) const;
  // Piece `p` placed in its server's region, whose id is `region`.
  RegionPiece InRegion(int64_t step, const PushPiece& p, uint64_t region, v1::GradientPiece header,
                       absl::Span<const std::byte> data) const;
  // Queues piece `p` on the gRPC push stream of `step` to its server, once
  // the budget has room for it.
  absl::Status EnqueueOnStream(int64_t step, const PushPiece& p, const v1::GradientPiece& header,
                               absl::Span<const std::byte> data,
                               const std::shared_ptr<const void>& owner);
  // Hands the pieces to their in-process calls, on up to CopyThreads()
  // threads (one with `lend`: nothing much is copied); the first error.
  absl::Status PushLocal(const std::vector<LocalPiece>& local,
                         const std::shared_ptr<const void>& owner, bool lend);

  client_internal::StreamEnds
      stream_ends;  // every push stream tells it when it ends; outlives them
  // Open push calls by step, then (server, connection). A stream is added
  // by the first piece of its (server, connection, step) and removed by
  // FinishStep.
  using PushLane = std::pair<int, int>;
  std::mutex mu;
  std::map<int64_t, std::map<PushLane, std::shared_ptr<client_internal::PushCall>>>
      streams;  // guarded by mu
  // Push calls whose pieces lie in a region, by server and step: step s's
  // bytes go into the area step s - 2's used once that step's call ended.
  // Guarded by mu.
  std::map<int, std::map<int64_t, std::shared_ptr<client_internal::PushCall>>> region_calls;

  mutable std::mutex state_mu;
  int64_t version = 0;    // guarded by state_mu
  double loss_scale = 1;  // guarded by state_mu
  // Set at Open when a server holds no state of a job the others have
  // trained (it restarted); every step operation refuses with it until a
  // Restore succeeds. Guarded by state_mu.
  std::string lost_state;
  // Oldest version the servers can serve: 0, or the version restored to.
  int64_t base_version = 0;  // guarded by state_mu

  // Serializes PullForStep (and Restore, which invalidates what it pulled).
  // The version PullForStep pulls for `step` (InvalidArgument below 1).
  absl::StatusOr<int64_t> StepVersion(int64_t step);
  std::mutex pull_for_step_mu;
  int64_t pulled_version = -1;   // guarded by pull_for_step_mu; -1: nothing pulled
  double pulled_loss_scale = 1;  // its steps' loss scale; guarded by pull_for_step_mu
};

template <typename Response, typename Call>
absl::StatusOr<Response> OffloadClient::Impl::Unary(const client_internal::CallSettings& settings,
                                                    int server, Call call_once,
                                                    client_internal::CallGroup* group) {
  Response response;
  absl::Status status =
      client_internal::RetryCall(settings, names[server], group, [&](grpc::ClientContext& context) {
        response.Clear();
        return FromGrpcStatus(call_once(*stubs[server], context, response));
      });
  if (!status.ok()) return status;
  return response;
}

}  // namespace zo

#endif  // ZO_WORKER_CLIENT_INTERNAL_OFFLOAD_CLIENT_IMPL_H_
