#include "worker/client/offload_client.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <fstream>
#include <map>
#include <mutex>
#include <set>
#include <thread>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "proto/zo/v1/offload_service.grpc.pb.h"
#include "rpc/call_context.h"
#include "rpc/channel.h"
#include "rpc/error_detail.h"
#include "rpc/in_process_route.h"
#include "rpc/proto_convert.h"
#include "rpc/rpc_util.h"
#include "worker/client/internal/byte_budget.h"
#include "worker/client/internal/call.h"
#include "worker/client/internal/local_push_call.h"
#include "worker/client/internal/piece_encoding.h"
#include "worker/client/internal/pull_receiver.h"
#include "worker/client/internal/push_stream.h"
#include "worker/client/internal/setup.h"
#include "worker/client/internal/worker_region.h"

namespace zo {
namespace {

using client_internal::ByteBudget;
using client_internal::CallGroup;
using client_internal::CallSettings;
using client_internal::JobDType;
using client_internal::LocalPushCall;
using client_internal::PullReceiver;
using client_internal::PushCall;
using client_internal::PushStream;
using client_internal::RetryCall;
using client_internal::RunInParallel;
using client_internal::StreamEnds;
using client_internal::ValidateOptions;
using client_internal::WorkerRegion;

// How long the destructor lets unfinished pushes end before cancelling them.
constexpr absl::Duration kCloseGrace = absl::Seconds(5);

// A piece over the in-process route is a chunk's part of a push, whole:
// the server takes it from the caller's memory, so nothing bounds it but
// the chunk.
constexpr int64_t kMaxLocalPieceBytes = int64_t{1} << 62;
// Over the in-process route a push's pieces are copied by up to
// kMaxCopyThreads threads (no more than the cores), a piece cut into parts
// of at least kLocalPartBytes.
constexpr int64_t kMaxCopyThreads = 4;
constexpr int64_t kLocalPartBytes = int64_t{4} << 20;
// Opens of a job that is being restored meanwhile, before Open gives up
// (UNAVAILABLE); about half a minute with the pauses between them.
constexpr int kOpenAttempts = 40;

int64_t CopyThreads() {
  return std::clamp<int64_t>(std::thread::hardware_concurrency(), 1, kMaxCopyThreads);
}

}  // namespace

std::vector<PushPiece> PlanPush(const ShardMap& map, int tensor, int64_t offset, int64_t elems,
                                int64_t elem_bytes, int64_t max_piece_bytes) {
  std::vector<PushPiece> pieces;
  const int64_t max_elems = std::max<int64_t>(1, max_piece_bytes / elem_bytes);
  const int64_t first = map.TensorRange(tensor).begin + offset;
  const int64_t last = first + elems;
  for (int64_t pos = first; pos < last;) {
    const int64_t chunk = pos / map.chunk_elems();
    const int64_t chunk_begin = chunk * map.chunk_elems();
    const int64_t end = std::min({last, chunk_begin + map.chunk_elems(), pos + max_elems});
    pieces.push_back({.server = map.ServerOfChunk(chunk),
                      .chunk = chunk,
                      .chunk_offset = pos - chunk_begin,
                      .byte_begin = (pos - first) * elem_bytes,
                      .byte_end = (end - first) * elem_bytes});
    pos = end;
  }
  return pieces;
}

// Members fixed at Open are const; the open push calls, the job's state and
// what PullForStep last pulled each have their own mutex, so a Push never
// waits on a Pull. Lock order: pull_for_step_mu before state_mu; mu before a
// PushStream's own.
struct OffloadClient::Impl {
  Impl(const ClientOptions& options_in, Config config_in, DType dtype_in, ShardMap map_in,
       std::vector<std::string> names_in, std::vector<std::shared_ptr<grpc::Channel>> channels_in,
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
  }

  ~Impl();

  std::atomic<int64_t> pushed_bytes{0};
  std::atomic<int64_t> pulled_bytes{0};
  // Per server, the instance of the job it opened (JobStatus.incarnation):
  // sent with every push and pull, so a server that has since reopened or
  // restored the job refuses them rather than mixing steps or layouts. Set
  // in Open and after this client's own Restore.
  std::unique_ptr<std::atomic<uint64_t>[]> incarnation;

  absl::Duration call_timeout() const { return call.attempt.timeout; }
  // A unary call to server `server` with retries; `call` makes one attempt.
  // `group` (may be null) cancels it.
  template <typename Response, typename Call>
  absl::StatusOr<Response> Unary(int server, Call call, CallGroup* group = nullptr);
  // Whether every server is still on the instance of the job its OpenJob
  // answered with, and the lead is not restoring it.
  absl::StatusOr<bool> SameInstanceAsOpened(const std::vector<v1::OpenJobResponse>& replies);

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
  // `owner` null: the bytes are copied; otherwise they are sent in place.
  absl::Status PushRange(int64_t step, int tensor, int64_t offset, absl::Span<const std::byte> data,
                         std::shared_ptr<const void> owner, int micro_batch = 0);
  // Push's check that `data` is the whole tensor.
  absl::Status CheckWholeTensor(int tensor, size_t bytes) const;
  absl::Status FinishStep(int64_t step);
  absl::Status InitParams(int tensor, absl::Span<const float> values);
  // One server's part of InitParams, retried (a range sent again overwrites).
  absl::Status InitParamsOn(int server, const std::vector<PushPiece>& pieces,
                            absl::Span<const float> values, CallGroup& group);
  absl::StatusOr<bool> Pull(int64_t version, int64_t have_version, absl::Span<const int> tensors,
                            absl::Span<const absl::Span<std::byte>> dst, double* loss_scale,
                            CallGroup* cancel);
  // One server's part of a Pull, retried.
  absl::Status PullFrom(int server, int64_t version, int64_t have_version, PullReceiver& receiver,
                        CallGroup& group);
  // The same over server `server`'s in-process route.
  absl::Status PullLocal(int server, const v1::PullParamsRequest& request, PullReceiver& receiver,
                         CallGroup& group);
  // Waits on the in-process route until the request's version exists, at
  // most until `deadline`; `group` cancels the wait.
  absl::Status AwaitLocalVersion(int server, const v1::PullParamsRequest& request,
                                 absl::Time deadline, CallGroup& group);
  void SetStatus(const v1::JobStatus& status);
  // A pull that ran out of time may wait on a version the servers cannot
  // make, because the lead cannot reach another server: `error` with what
  // the lead says it is stuck on, so the message names the server at fault.
  absl::Status WithStuckPeer(absl::Status error);

  const ClientOptions options;
  const CallSettings call;
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
  ByteBudget budget;

  // The same-host route, per server: this worker's region and its id on
  // that server (0: gRPC carries the data). Set at Open (and again after a
  // rollback); an id drops to 0 when the server no longer knows it.
  std::vector<std::unique_ptr<WorkerRegion>> regions;
  std::unique_ptr<std::atomic<uint64_t>[]> region_ids;
  // One pull at a time writes a server's weights area.
  std::unique_ptr<std::mutex[]> region_pull_mu;
  // Makes the regions (first call) and attaches them to their servers; a
  // server that refuses gets gRPC, with a log line saying why.
  void AttachRegions();
  uint64_t RegionId(int server) const {
    return region_ids == nullptr ? 0 : region_ids[server].load(std::memory_order_relaxed);
  }
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
  // before, whose area they reuse, is in), then sends their headers.
  absl::Status PushThroughRegions(int64_t step, const std::vector<RegionPiece>& pieces);

  StreamEnds stream_ends;  // every push stream tells it when it ends; outlives them
  // Open push calls by step, then server. A stream is added by the first
  // piece of its (server, step) and removed by FinishStep.
  std::mutex mu;
  std::map<int64_t, std::map<int, std::shared_ptr<PushCall>>> streams;  // guarded by mu
  // Push calls whose pieces lie in a region, by server and step: step s's
  // bytes go into the area step s - 2's used once that step's call ended.
  // Guarded by mu.
  std::map<int, std::map<int64_t, std::shared_ptr<PushCall>>> region_calls;

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
  std::mutex pull_for_step_mu;
  int64_t pulled_version = -1;   // guarded by pull_for_step_mu; -1: nothing pulled
  double pulled_loss_scale = 1;  // its steps' loss scale; guarded by pull_for_step_mu
};

OffloadClient::Impl::~Impl() {
  std::map<int64_t, std::map<int, std::shared_ptr<PushCall>>> open;
  {
    std::lock_guard lock(mu);
    open.swap(streams);
  }
  for (auto& [step, by_server] : open) {
    for (auto& [server, stream] : by_server) stream->Close();
  }
  const absl::Time give_up = absl::Now() + kCloseGrace;
  for (auto& [step, by_server] : open) {
    for (auto& [server, stream] : by_server) {
      if (!stream->WaitFor(std::max(give_up - absl::Now(), absl::ZeroDuration()))) {
        ZO_LOG(WARNING) << "cancelling the unfinished gradient push of step " << step
                        << " to server " << names[server];
        stream->Cancel();
      } else if (absl::Status s = stream->status(); !s.ok()) {
        ZO_LOG(WARNING) << "gradient push of step " << step << " was never finished: " << s;
      }
    }
  }
  // The streams' destructors join their threads.
}

template <typename Response, typename Call>
absl::StatusOr<Response> OffloadClient::Impl::Unary(int server, Call call_once, CallGroup* group) {
  Response response;
  absl::Status status = RetryCall(call, names[server], group, [&](grpc::ClientContext& context) {
    response.Clear();
    return FromGrpcStatus(call_once(*stubs[server], context, response));
  });
  if (!status.ok()) return status;
  return response;
}

void OffloadClient::Impl::AttachRegions() {
  const int num_servers = map.num_servers();
  if (regions.empty()) {
    regions.resize(num_servers);
    region_ids = std::make_unique<std::atomic<uint64_t>[]>(num_servers);
    region_pull_mu = std::make_unique<std::mutex[]>(num_servers);
    for (int s = 0; s < num_servers; ++s) {
      const int64_t area = map.ElemsOnServer(s) * elem_bytes;
      if (area == 0) continue;
      if (3 * area > options.max_region_bytes) {
        ZO_LOG(INFO) << "server " << names[s] << ": gradients and weights go over gRPC (a "
                     << "shared-memory region would take " << 3 * area << " bytes, more than "
                     << options.max_region_bytes << ": ClientOptions::max_region_bytes)";
        continue;
      }
      absl::StatusOr<std::unique_ptr<WorkerRegion>> region = WorkerRegion::Create(area);
      if (!region.ok()) {
        ZO_LOG(WARNING) << "server " << names[s] << ": no shared-memory region ("
                        << region.status().message() << "); gradients and weights go over gRPC";
        continue;
      }
      regions[s] = *std::move(region);
    }
  }
  static const std::string boot_id = [] {
    std::ifstream in("/proc/sys/kernel/random/boot_id");
    std::string id;
    std::getline(in, id);
    return id;
  }();
  for (int s = 0; s < num_servers; ++s) {
    region_ids[s] = 0;
    if (regions[s] == nullptr) continue;
    v1::AttachRegionRequest request;
    request.set_job(options.job);
    request.set_pid(getpid());
    request.set_fd(regions[s]->fd());
    request.set_bytes(regions[s]->bytes());
    request.set_boot_id(boot_id);
    request.set_proof(regions[s]->proof());
    absl::StatusOr<v1::AttachRegionResponse> attached = Unary<v1::AttachRegionResponse>(
        s, [&](v1::Offload::Stub& stub, grpc::ClientContext& context,
               v1::AttachRegionResponse& response) {
          return stub.AttachRegion(&context, request, &response);
        });
    if (!attached.ok()) {
      ZO_LOG(INFO) << "server " << names[s]
                   << ": gradients and weights go over gRPC (no shared memory: "
                   << attached.status().message() << ")";
      continue;
    }
    region_ids[s] = attached->region();
    ZO_LOG(INFO) << "server " << names[s]
                 << ": gradients and weights go through shared memory (same host)";
  }
}

void OffloadClient::Impl::DropRegion(int server, const absl::Status& why) {
  if (region_ids == nullptr || region_ids[server].exchange(0) == 0) return;
  ZO_LOG(WARNING) << "server " << names[server]
                  << ": gradients and weights go over gRPC from now on (" << why.message() << ")";
}

void OffloadClient::Impl::SetStatus(const v1::JobStatus& status) {
  std::lock_guard lock(state_mu);
  version = status.version();
  loss_scale = status.loss_scale();
  base_version = status.base_version();
}

absl::Status OffloadClient::Impl::StepErrorLocked(int64_t step) const {
  auto it = streams.find(step);
  if (it == streams.end()) return absl::OkStatus();
  for (const auto& [server, stream] : it->second) {
    if (absl::Status s = stream->status(); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status OffloadClient::Impl::PushRange(int64_t step, int tensor, int64_t offset,
                                            absl::Span<const std::byte> data,
                                            std::shared_ptr<const void> owner, int micro_batch) {
  ZO_RETURN_IF_ERROR(CheckState());
  if (step < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot push step ", step, ": steps are numbered from 1"));
  }
  if (micro_batch < 0 || micro_batch >= PushesPerRank(config)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "micro-batch ", micro_batch, " is outside [0, ", PushesPerRank(config),
        ") (a job pushes per micro-batch only with zo.gradient_accumulation \"servers\")"));
  }
  ZO_RETURN_IF_ERROR(CheckTensorIndex(tensor));
  const int64_t bytes = static_cast<int64_t>(data.size());
  if (bytes % elem_bytes != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("pushed ", bytes, " bytes for ", TensorLabel(tensor), ", not a multiple of ",
                     std::string(DTypeName(dtype)), "'s ", elem_bytes));
  }
  const int64_t elems = bytes / elem_bytes;
  const int64_t tensor_elems = map.TensorRange(tensor).size();
  if (offset < 0 || offset > tensor_elems || elems > tensor_elems - offset) {
    return absl::InvalidArgumentError(absl::StrCat("pushed elements [", offset, ", ",
                                                   offset + elems, ") of ", TensorLabel(tensor),
                                                   ", which has ", tensor_elems));
  }
  {
    std::lock_guard lock(mu);
    ZO_RETURN_IF_ERROR(StepErrorLocked(step));
  }
  // Pieces for the in-process route, handed over once all are planned.
  struct LocalPiece {
    std::shared_ptr<PushCall> call;
    v1::GradientPiece header;
    absl::Span<const std::byte> data;
  };
  std::vector<LocalPiece> local;
  std::vector<RegionPiece> in_region;
  // The in-process and same-host routes take a chunk's part whole; gRPC's
  // messages are cut at max_piece_bytes.
  bool whole_chunks = true;
  for (int s = 0; s < map.num_servers(); ++s) {
    whole_chunks = whole_chunks && (routes[s] != nullptr || RegionId(s) != 0);
  }
  const int64_t max_piece_bytes = whole_chunks ? kMaxLocalPieceBytes : options.max_piece_bytes;
  for (const PushPiece& p : PlanPush(map, tensor, offset, elems, elem_bytes, max_piece_bytes)) {
    const int64_t piece_bytes = p.byte_end - p.byte_begin;
    v1::GradientPiece header;
    header.set_job(options.job);
    header.set_step(step);
    header.set_dp_rank(options.dp_rank);
    header.set_chunk(p.chunk);
    header.set_offset(p.chunk_offset);
    header.set_dtype(DTypeToProto(dtype));
    header.set_resend(options.resend);
    header.set_incarnation(incarnation[p.server].load(std::memory_order_relaxed));
    header.set_micro_batch(micro_batch);

    if (routes[p.server] != nullptr) {
      std::shared_ptr<PushCall> call;
      {
        // Found under mu; pushed through unlocked, so pushes of several
        // threads convert in parallel. A FinishStep meanwhile closes the
        // call, and this push then fails as a late one.
        std::lock_guard lock(mu);
        std::shared_ptr<PushCall>& slot = streams[step][p.server];
        if (slot == nullptr) {
          slot =
              std::make_shared<LocalPushCall>(routes[p.server], names[p.server], step,
                                              absl::Now() + call_timeout(), &budget, &stream_ends);
        }
        call = slot;
      }
      // A big piece is handed over in parts by several threads: one thread
      // cannot draw the memory bandwidth a copy wants.
      const int64_t parts = std::clamp<int64_t>(piece_bytes / kLocalPartBytes, 1, CopyThreads());
      const int64_t part_elems = (piece_bytes / elem_bytes + parts - 1) / parts;
      for (int64_t e = 0; e < piece_bytes / elem_bytes; e += part_elems) {
        const int64_t n = std::min(part_elems, piece_bytes / elem_bytes - e);
        v1::GradientPiece part = header;
        part.set_offset(p.chunk_offset + e);
        local.push_back({.call = call,
                         .header = std::move(part),
                         .data = data.subspan(static_cast<size_t>(p.byte_begin + e * elem_bytes),
                                              static_cast<size_t>(n * elem_bytes))});
      }
      continue;
    }
    if (const uint64_t region = RegionId(p.server); region != 0) {
      const WorkerRegion& r = *regions[p.server];
      // The element's place in the server's local order: its chunks, all
      // full but the job's last, one after another.
      const int64_t local_elem = (p.chunk / map.num_servers()) * map.chunk_elems() + p.chunk_offset;
      const int64_t at = r.GradientAreaOffset(step) + local_elem * elem_bytes;
      header.set_region(region);
      header.set_region_offset(at);
      header.set_region_bytes(piece_bytes);
      in_region.push_back({.server = p.server,
                           .header = std::move(header),
                           .data = data.subspan(static_cast<size_t>(p.byte_begin),
                                                static_cast<size_t>(piece_bytes)),
                           .dst = r.base() + at});
      continue;
    }

    budget.Acquire(step, piece_bytes);
    client_internal::EncodedPiece piece = client_internal::EncodeGradientPiece(
        header, data.data() + p.byte_begin, static_cast<size_t>(piece_bytes), owner);

    // Enqueue under mu, so that FinishStep cannot take the stream away
    // between finding it and queuing on it.
    std::lock_guard lock(mu);
    std::shared_ptr<PushCall>& stream = streams[step][p.server];
    if (stream == nullptr) {
      stream = std::make_shared<PushStream>(channels[p.server], names[p.server], step,
                                            NewCallContext(call.attempt), &budget, &stream_ends);
    }
    ZO_RETURN_IF_ERROR(static_cast<PushStream&>(*stream).Enqueue(std::move(piece)));
  }
  if (!in_region.empty()) ZO_RETURN_IF_ERROR(PushThroughRegions(step, in_region));
  if (!local.empty()) {
    const int threads = static_cast<int>(std::min<int64_t>(local.size(), CopyThreads()));
    std::vector<absl::Status> results(threads);
    auto push_every = [&](int first) {
      for (size_t i = first; i < local.size() && results[first].ok(); i += threads) {
        results[first] =
            static_cast<LocalPushCall&>(*local[i].call).Push(local[i].header, local[i].data, owner);
      }
    };
    std::vector<std::thread> helpers;
    for (int t = 1; t < threads; ++t) helpers.emplace_back(push_every, t);
    push_every(0);
    for (std::thread& t : helpers) t.join();
    for (absl::Status& r : results) ZO_RETURN_IF_ERROR(r);
  }
  pushed_bytes.fetch_add(bytes, std::memory_order_relaxed);
  return absl::OkStatus();
}

absl::Status OffloadClient::Impl::PushThroughRegions(int64_t step,
                                                     const std::vector<RegionPiece>& pieces) {
  std::set<int> servers;
  for (const RegionPiece& p : pieces) servers.insert(p.server);
  // The step two before used the same area: its calls must have ended
  // (every piece of it in the server's accumulator) before it is written.
  std::vector<std::pair<int, std::shared_ptr<PushCall>>> older;
  {
    std::lock_guard lock(mu);
    for (int s : servers) {
      auto& calls = region_calls[s];
      for (auto it = calls.begin(); it != calls.end() && it->first <= step - 2; ++it) {
        older.emplace_back(s, it->second);
      }
    }
  }
  const absl::Time deadline = absl::Now() + call_timeout();
  for (auto& [s, c] : older) {
    if (!c->WaitFor(std::max(deadline - absl::Now(), absl::ZeroDuration()))) {
      return absl::FailedPreconditionError(absl::StrCat(
          "server ", names[s], ": step ", step,
          "'s gradients would overwrite, in the shared region, those of a step two before it that "
          "are still being pushed: finish that step (FinishStep) first"));
    }
  }
  {
    std::lock_guard lock(mu);
    for (int s : servers) {
      auto& calls = region_calls[s];
      for (auto it = calls.begin(); it != calls.end() && it->first <= step - 2;) {
        it = it->second->WaitFor(absl::ZeroDuration()) ? calls.erase(it) : std::next(it);
      }
    }
  }
  // The copies, in parts of at least kLocalPartBytes, on several threads.
  struct Part {
    std::byte* dst;
    const std::byte* src;
    size_t n;
  };
  std::vector<Part> parts;
  for (const RegionPiece& p : pieces) {
    const auto bytes = static_cast<int64_t>(p.data.size());
    const int64_t k = std::clamp<int64_t>(bytes / kLocalPartBytes, 1, CopyThreads());
    const int64_t part = ((bytes / elem_bytes + k - 1) / k) * elem_bytes;
    for (int64_t at = 0; at < bytes; at += part) {
      parts.push_back(
          {p.dst + at, p.data.data() + at, static_cast<size_t>(std::min(part, bytes - at))});
    }
  }
  const int threads = static_cast<int>(std::min<int64_t>(parts.size(), CopyThreads()));
  auto copy_every = [&](int first) {
    for (size_t i = first; i < parts.size(); i += threads) {
      std::memcpy(parts[i].dst, parts[i].src, parts[i].n);
    }
  };
  std::vector<std::thread> helpers;
  for (int t = 1; t < threads; ++t) helpers.emplace_back(copy_every, t);
  copy_every(0);
  for (std::thread& t : helpers) t.join();

  // The headers, under mu so that FinishStep cannot take a stream away
  // between finding it and queuing on it.
  std::lock_guard lock(mu);
  for (const RegionPiece& p : pieces) {
    std::shared_ptr<PushCall>& stream = streams[step][p.server];
    if (stream == nullptr) {
      stream = std::make_shared<PushStream>(channels[p.server], names[p.server], step,
                                            NewCallContext(call.attempt), &budget, &stream_ends);
      region_calls[p.server][step] = stream;
    }
    ZO_RETURN_IF_ERROR(
        static_cast<PushStream&>(*stream).Enqueue(client_internal::EncodeRegionPiece(p.header)));
  }
  return absl::OkStatus();
}

absl::Status OffloadClient::Impl::FinishStep(int64_t step) {
  ZO_RETURN_IF_ERROR(CheckState());
  std::map<int, std::shared_ptr<PushCall>> open;
  {
    std::lock_guard lock(mu);
    auto it = streams.find(step);
    if (it == streams.end()) return absl::OkStatus();
    open = std::move(it->second);
    streams.erase(it);
  }
  absl::Time look_again = absl::InfiniteFuture();
  for (auto& [server, stream] : open) {
    stream->Close();
    look_again = std::min(look_again, stream->deadline());
  }
  // Until every call has ended, or one has failed. Each call has a deadline
  // (call_timeout from its first piece), so this wait ends: a gRPC call at
  // it by itself, an in-process one when WaitFor looks at it then.
  absl::Status failed;
  {
    std::unique_lock lock(stream_ends.mu);
    auto ended = [&] {
      bool all_done = true;
      for (auto& [server, stream] : open) {
        if (!stream->WaitFor(absl::ZeroDuration())) {
          all_done = false;
        } else if (absl::Status s = stream->status(); !s.ok()) {
          failed = std::move(s);
          return true;
        }
      }
      return all_done;
    };
    if (look_again == absl::InfiniteFuture()) {
      stream_ends.cv.wait(lock, ended);
    } else {
      while (!stream_ends.cv.wait_until(lock, absl::ToChronoTime(look_again), ended)) {
        look_again = absl::Now() + absl::Seconds(1);  // past the deadline: WaitFor ends them
      }
    }
  }
  if (failed.ok()) return absl::OkStatus();
  // A server that lost this worker's region (it restarted): the step's
  // pushes go again, over gRPC.
  if (ReasonOf(failed) == v1::ErrorDetail::UNKNOWN_REGION) {
    for (auto& [server, stream] : open) {
      if (stream->WaitFor(absl::ZeroDuration()) &&
          ReasonOf(stream->status()) == v1::ErrorDetail::UNKNOWN_REGION) {
        DropRegion(server, failed);
      }
    }
  }
  // The step cannot be finished now: the other calls are ended here rather
  // than at their deadline. (A server that lost its lead keeps a push for
  // the next step waiting until then, and the worker would wait with it
  // before it could go and look for the job again.)
  for (auto& [server, stream] : open) {
    if (!stream->WaitFor(absl::ZeroDuration())) stream->Cancel();
  }
  for (auto& [server, stream] : open) stream->WaitFor(absl::InfiniteDuration());
  return failed;
}

absl::Status OffloadClient::Impl::InitParamsOn(int server, const std::vector<PushPiece>& pieces,
                                               absl::Span<const float> values, CallGroup& group) {
  static_assert(std::endian::native == std::endian::little,
                "the wire carries little-endian fp32; add a byte swap for this host");
  const auto* bytes = reinterpret_cast<const char*>(values.data());
  return RetryCall(call, names[server], &group, [&](grpc::ClientContext& context) {
    v1::InitParamsResponse response;
    std::unique_ptr<grpc::ClientWriter<v1::ParamInitPiece>> writer =
        stubs[server]->InitParams(&context, &response);
    int64_t written = 0;
    v1::ParamInitPiece piece;
    piece.set_job(options.job);
    for (const PushPiece& p : pieces) {
      if (p.server != server) continue;
      piece.set_chunk(p.chunk);
      piece.set_offset(p.chunk_offset);
      piece.set_data(bytes + p.byte_begin, static_cast<size_t>(p.byte_end - p.byte_begin));
      if (!writer->Write(piece)) break;  // the call ended; Finish says why
      ++written;
    }
    writer->WritesDone();
    ZO_RETURN_IF_ERROR(FromGrpcStatus(writer->Finish()));
    if (response.pieces() != written) {
      return absl::DataLossError(absl::StrCat("acknowledged ", response.pieces(), " of the ",
                                              written, " initial weight pieces sent"));
    }
    return absl::OkStatus();
  });
}

absl::Status OffloadClient::Impl::InitParams(int tensor, absl::Span<const float> values) {
  ZO_RETURN_IF_ERROR(CheckState());
  ZO_RETURN_IF_ERROR(CheckTensorIndex(tensor));
  const int64_t elems = map.TensorRange(tensor).size();
  if (static_cast<int64_t>(values.size()) != elems) {
    return absl::InvalidArgumentError(absl::StrCat("initial weights of ", TensorLabel(tensor),
                                                   ": got ", values.size(), " values for ", elems,
                                                   " elements"));
  }
  const std::vector<PushPiece> pieces =
      PlanPush(map, tensor, 0, elems, sizeof(float), options.max_piece_bytes);
  std::vector<int> servers;
  for (const PushPiece& p : pieces) {
    if (std::find(servers.begin(), servers.end(), p.server) == servers.end()) {
      servers.push_back(p.server);
    }
  }
  CallGroup group;
  return RunInParallel(servers.size(), group,
                       [&](size_t i) { return InitParamsOn(servers[i], pieces, values, group); });
}

absl::Status OffloadClient::Impl::PullFrom(int server, int64_t version, int64_t have_version,
                                           PullReceiver& receiver, CallGroup& group) {
  v1::PullParamsRequest request;
  request.set_job(options.job);
  request.set_version(version);
  request.set_have_version(have_version);
  request.set_incarnation(incarnation[server].load(std::memory_order_relaxed));
  for (int t : receiver.tensors()) request.add_tensors(t);
  if (routes[server] != nullptr) return PullLocal(server, request, receiver, group);
  const uint64_t region = RegionId(server);
  std::unique_lock<std::mutex> region_lock;
  if (region != 0) {
    // Into the weights area, which one pull at a time may use.
    request.set_region(region);
    request.set_region_offset(regions[server]->WeightsAreaOffset());
    region_lock = std::unique_lock(region_pull_mu[server]);
  }
  absl::Status pulled = RetryCall(call, names[server], &group, [&](grpc::ClientContext& context) {
    receiver.Reset();
    std::unique_ptr<grpc::ClientReader<v1::ParamPiece>> reader =
        stubs[server]->PullParams(&context, request);
    v1::ParamPiece piece;
    while (reader->Read(&piece)) {
      absl::Status s = region == 0
                           ? receiver.Accept(piece)
                           : receiver.AcceptFromRegion(piece, regions[server]->weights(),
                                                       regions[server]->WeightsAreaOffset());
      if (!s.ok()) {
        context.TryCancel();
        reader->Finish();
        return s;
      }
    }
    ZO_RETURN_IF_ERROR(FromGrpcStatus(reader->Finish()));
    return receiver.Finish();
  });
  if (region != 0 && ReasonOf(pulled) == v1::ErrorDetail::UNKNOWN_REGION) {
    // The server lost this worker's region (it restarted): over gRPC.
    DropRegion(server, pulled);
    region_lock.unlock();
    return PullFrom(server, version, have_version, receiver, group);
  }
  return pulled;
}

absl::Status OffloadClient::Impl::AwaitLocalVersion(int server,
                                                    const v1::PullParamsRequest& request,
                                                    absl::Time deadline, CallGroup& group) {
  InProcessRoute& route = *routes[server];
  // Woken by the server (the version came, or the job changed) or by the
  // group's cancellation; shared, as a wake may run after this returns.
  struct Waiter {
    std::mutex mu;
    std::condition_variable cv;
    bool woken = false;
    void Wake() {
      {
        std::lock_guard lock(mu);
        woken = true;
      }
      cv.notify_all();
    }
  };
  auto waiter = std::make_shared<Waiter>();
  for (;;) {
    {
      std::lock_guard lock(waiter->mu);
      waiter->woken = false;
    }
    uint64_t ticket = 0;
    ZO_ASSIGN_OR_RETURN(const bool has, route.AwaitVersion(
                                            request.job(), request.version(), request.incarnation(),
                                            [waiter] { waiter->Wake(); }, &ticket));
    if (has) return absl::OkStatus();
    const bool cancellable = group.AddHook(waiter.get(), [waiter] { waiter->Wake(); });
    bool woken = false;
    if (cancellable) {
      std::unique_lock lock(waiter->mu);
      woken =
          waiter->cv.wait_until(lock, absl::ToChronoTime(deadline), [&] { return waiter->woken; });
    }
    group.RemoveHook(waiter.get());
    if (group.cancelled()) {
      route.CancelVersionWait(request.job(), ticket);
      return absl::CancelledError(
          absl::StrCat("the pull of version ", request.version(), " was cancelled"));
    }
    if (!woken && route.CancelVersionWait(request.job(), ticket)) {
      return absl::DeadlineExceededError(absl::StrCat("version ", request.version(), " of job ",
                                                      request.job(), " did not exist within ",
                                                      absl::FormatDuration(call.attempt.timeout)));
    }
    // Woken: ask again.
  }
}

absl::Status OffloadClient::Impl::PullLocal(int server, const v1::PullParamsRequest& request,
                                            PullReceiver& receiver, CallGroup& group) {
  InProcessRoute& route = *routes[server];
  const auto place = [&](const InProcessRoute::PulledRange& r) {
    return receiver.Place(r.tensor, r.offset, r.elems);
  };
  return RetryCall(call, names[server], &group, [&](grpc::ClientContext&) -> absl::Status {
    receiver.Reset();
    // The next version's update writes the weights here itself when it can.
    ZO_ASSIGN_OR_RETURN(const uint64_t fill, route.RegisterPull(request, place));
    if (fill == 0) receiver.Reset();  // it may have asked for places before saying no
    absl::Cleanup withdraw = [&] {
      if (fill != 0) route.WithdrawPull(fill);
    };
    ZO_RETURN_IF_ERROR(
        AwaitLocalVersion(server, request, absl::Now() + call.attempt.timeout, group));
    if (fill != 0) {
      std::move(withdraw).Cancel();
      ZO_ASSIGN_OR_RETURN(const std::optional<InProcessRoute::PullResult> filled,
                          route.TakeFilledPull(request, fill));
      if (filled.has_value()) {
        ZO_RETURN_IF_ERROR(receiver.SetLossScale(filled->loss_scale));
        return receiver.Finish();
      }
      receiver.Reset();  // not filled (a skipped step, a restore): read it
    }
    ZO_ASSIGN_OR_RETURN(const InProcessRoute::PullResult result, route.PullInto(request, place));
    ZO_RETURN_IF_ERROR(result.unchanged ? receiver.AcceptUnchanged(result.loss_scale)
                                        : receiver.SetLossScale(result.loss_scale));
    return receiver.Finish();
  });
}

absl::Status OffloadClient::Impl::WithStuckPeer(absl::Status error) {
  if (error.code() != absl::StatusCode::kDeadlineExceeded &&
      error.code() != absl::StatusCode::kUnavailable) {
    return error;
  }
  v1::GetJobStatusRequest request;
  request.set_job(options.job);
  absl::StatusOr<v1::JobStatus> lead = Unary<v1::JobStatus>(
      0, [&](v1::Offload::Stub& stub, grpc::ClientContext& context, v1::JobStatus& response) {
        return stub.GetJobStatus(&context, request, &response);
      });
  if (!lead.ok() || lead->waiting_on_peer().empty()) return error;
  return WithMessage(error, absl::StrCat(error.message(), "; the lead (", names[0],
                                         ") is stuck: ", lead->waiting_on_peer()));
}

absl::StatusOr<bool> OffloadClient::Impl::Pull(int64_t version, int64_t have_version,
                                               absl::Span<const int> tensors,
                                               absl::Span<const absl::Span<std::byte>> dst,
                                               double* loss_scale, CallGroup* cancel) {
  ZO_RETURN_IF_ERROR(CheckState());
  if (version < 0 || have_version < -1) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot pull version ", version, " over version ", have_version));
  }
  if (tensors.empty() || tensors.size() != dst.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("pull of ", tensors.size(), " tensors into ", dst.size(), " buffers"));
  }
  std::vector<bool> seen(map.tensors().size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    const int t = tensors[i];
    ZO_RETURN_IF_ERROR(CheckTensorIndex(t));
    if (seen[t]) {
      return absl::InvalidArgumentError(
          absl::StrCat(TensorLabel(t), " is asked for twice in one pull"));
    }
    seen[t] = true;
    const int64_t want = map.TensorRange(t).size() * elem_bytes;
    if (static_cast<int64_t>(dst[i].size()) != want) {
      return absl::InvalidArgumentError(absl::StrCat("the buffer for ", TensorLabel(t), " has ",
                                                     dst[i].size(), " bytes; it needs ", want));
    }
  }

  std::vector<int> servers;
  std::vector<std::unique_ptr<PullReceiver>> receivers;
  for (int s = 0; s < map.num_servers(); ++s) {
    auto receiver =
        std::make_unique<PullReceiver>(map, dtype, s, version, have_version, tensors, dst);
    if (receiver->tensors().empty()) continue;  // owns nothing of these tensors
    servers.push_back(s);
    receivers.push_back(std::move(receiver));
  }
  if (receivers.empty()) return true;  // only empty tensors: dst holds any version

  CallGroup group;
  if (cancel != nullptr && !cancel->AddChild(&group)) {
    return absl::CancelledError(absl::StrCat("the pull of version ", version, " was cancelled"));
  }
  absl::Status pulled = RunInParallel(receivers.size(), group, [&](size_t i) {
    return PullFrom(servers[i], version, have_version, *receivers[i], group);
  });
  if (cancel != nullptr) cancel->RemoveChild(&group);
  if (!pulled.ok()) return WithStuckPeer(std::move(pulled));

  const bool unchanged =
      std::all_of(receivers.begin(), receivers.end(), [](const auto& r) { return r->unchanged(); });
  if (!unchanged) {
    int64_t bytes = 0;
    for (const absl::Span<std::byte>& d : dst) bytes += static_cast<int64_t>(d.size());
    pulled_bytes.fetch_add(bytes, std::memory_order_relaxed);
  }
  if (loss_scale != nullptr) *loss_scale = receivers.front()->loss_scale();
  {
    std::lock_guard lock(state_mu);
    if (version >= this->version) {
      this->version = version;
      this->loss_scale = receivers.front()->loss_scale();
    }
  }
  return !unchanged;
}

absl::StatusOr<bool> OffloadClient::Impl::SameInstanceAsOpened(
    const std::vector<v1::OpenJobResponse>& replies) {
  std::vector<v1::JobStatus> now(replies.size());
  CallGroup group;
  ZO_RETURN_IF_ERROR(RunInParallel(replies.size(), group, [&](size_t i) -> absl::Status {
    v1::GetJobStatusRequest request;
    request.set_job(options.job);
    ZO_ASSIGN_OR_RETURN(now[i], Unary<v1::JobStatus>(
                                    static_cast<int>(i),
                                    [&](v1::Offload::Stub& stub, grpc::ClientContext& context,
                                        v1::JobStatus& status) {
                                      return stub.GetJobStatus(&context, request, &status);
                                    },
                                    &group));
    return absl::OkStatus();
  }));
  if (now[0].restoring()) return false;  // a rollback under way
  for (size_t i = 0; i < replies.size(); ++i) {
    if (now[i].incarnation() != replies[i].status().incarnation()) return false;
  }
  return true;
}

absl::StatusOr<std::unique_ptr<OffloadClient>> OffloadClient::Open(
    const ClientOptions& options, const std::string& config_json,
    std::vector<TensorSpec> manifest) {
  ZO_ASSIGN_OR_RETURN(LoadedConfig loaded,
                      ParseConfig(config_json, {.dp_world_size = options.dp_world_size}));
  const auto [dtype, dtype_reason] = JobDType(loaded.config);
  ZO_RETURN_IF_ERROR(ValidateOptions(options, static_cast<int64_t>(DTypeSize(dtype))));
  for (const TensorSpec& t : manifest) {
    if (t.dtype != dtype) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor '", t.name, "' of the manifest is ", std::string(DTypeName(t.dtype)),
          ", but the job's dtype is ", std::string(DTypeName(dtype)), " (", dtype_reason, ")"));
    }
  }
  const v1::Manifest wire_manifest = ManifestToProto(manifest);

  std::vector<std::string> names;
  std::vector<std::shared_ptr<grpc::Channel>> channels = options.channels;
  if (!channels.empty()) {
    for (size_t i = 0; i < channels.size(); ++i) names.push_back(absl::StrCat("inproc:", i));
  } else {
    names = options.servers;
    for (const std::string& address : names) {
      ZO_ASSIGN_OR_RETURN(std::shared_ptr<grpc::Channel> channel,
                          NewChannel(address, {.tls_root_certs = options.tls_root_certs}));
      channels.push_back(std::move(channel));
    }
  }
  ZO_ASSIGN_OR_RETURN(ShardMap map,
                      ShardMap::Create(std::move(manifest), loaded.config.zo.chunk_elems,
                                       static_cast<int>(channels.size())));
  auto impl = std::make_unique<Impl>(options, std::move(loaded.config), dtype, std::move(map),
                                     names, std::move(channels), options.routes);

  // In parallel: a server's OpenJob may wait for the others of the job.
  const int num_servers = static_cast<int>(names.size());
  std::vector<v1::OpenJobResponse> replies(num_servers);
  for (int attempt = 1;; ++attempt) {
    CallGroup group;
    ZO_RETURN_IF_ERROR(RunInParallel(num_servers, group, [&](size_t i) -> absl::Status {
      v1::OpenJobRequest request;
      request.set_job(options.job);
      *request.mutable_manifest() = wire_manifest;
      request.set_config_json(config_json);
      request.set_dp_world_size(options.dp_world_size);
      for (const std::string& name : names) request.add_servers(name);
      request.set_server_index(static_cast<int>(i));
      request.set_attach_only(options.attach_only);
      request.set_init_fingerprint(options.init_fingerprint);
      ZO_ASSIGN_OR_RETURN(replies[i], impl->Unary<v1::OpenJobResponse>(
                                          static_cast<int>(i),
                                          [&](v1::Offload::Stub& stub, grpc::ClientContext& context,
                                              v1::OpenJobResponse& response) {
                                            return stub.OpenJob(&context, request, &response);
                                          },
                                          &group));
      return absl::OkStatus();
    }));
    // One server's open may have been retried until the lead rolled the job
    // back onto it (it restarted), while the others answered before: their
    // answers are of the instance the rollback replaced, and this client
    // would wait forever for a version that instance had reached.
    ZO_ASSIGN_OR_RETURN(const bool settled, impl->SameInstanceAsOpened(replies));
    if (settled) break;
    if (attempt == kOpenAttempts) {
      return absl::UnavailableError(absl::StrCat("job ", options.job, " was restored ",
                                                 kOpenAttempts,
                                                 " times while this worker opened it; try again"));
    }
    ZO_LOG(INFO) << "job " << options.job << " was restored while this worker opened it; "
                 << "opening it again";
    absl::SleepFor(std::min(absl::Milliseconds(50) * attempt, absl::Seconds(1)));
  }

  const v1::JobStatus& lead = replies[0].status();
  impl->SetStatus(lead);
  impl->incarnation = std::make_unique<std::atomic<uint64_t>[]>(num_servers);
  for (int i = 0; i < num_servers; ++i) impl->incarnation[i] = replies[i].status().incarnation();
  // Servers given by address may be on this host: the same-host route.
  if (options.shared_memory && options.channels.empty()) impl->AttachRegions();
  // A server that opened the job fresh while another holds it trained has
  // restarted and lost its part: training on would mix version 0 with the
  // others' state. Refuse every step until the job is restored.
  int trained = -1;
  for (int i = 0; i < num_servers; ++i) {
    if (replies[i].attached() && replies[i].status().version() > 0) trained = i;
  }
  for (int i = 0; trained >= 0 && i < num_servers; ++i) {
    if (replies[i].attached()) continue;
    impl->lost_state = absl::StrCat(
        "job '", options.job, "' is at version ", replies[trained].status().version(), " on ",
        names[trained], " but ", names[i], " (server ", i,
        ") holds nothing of it: it restarted and lost its part. Restore the job from a "
        "checkpoint before training on (zo-train --restore latest, zo.torch's "
        "load_checkpoint, or OffloadClient::Restore)");
    ZO_LOG(ERROR) << impl->lost_state;
    break;
  }
  ZO_LOG(INFO) << (replies[0].attached() ? "attached to" : "opened") << " job " << options.job
               << " on " << num_servers << " server(s) at version " << lead.version()
               << " as dp rank " << options.dp_rank << " of " << options.dp_world_size;
  if (!lead.needs_restore().empty()) {
    ZO_LOG(WARNING) << "job " << options.job << " needs a restore: " << lead.needs_restore();
  }
  return std::unique_ptr<OffloadClient>(new OffloadClient(std::move(impl)));
}

OffloadClient::OffloadClient(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
OffloadClient::~OffloadClient() = default;

const ShardMap& OffloadClient::shard_map() const { return impl_->map; }
const Config& OffloadClient::config() const { return impl_->config; }

absl::Status OffloadClient::InitParams(int tensor, absl::Span<const float> values) {
  return impl_->InitParams(tensor, values);
}

absl::Status OffloadClient::Impl::CheckWholeTensor(int tensor, size_t bytes) const {
  if (tensor < 0 || tensor >= static_cast<int>(map.tensors().size())) {
    return absl::OkStatus();  // PushRange names the bad index
  }
  const int64_t want = map.TensorRange(tensor).size() * elem_bytes;
  if (static_cast<int64_t>(bytes) == want) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("pushed ", bytes, " bytes for ", TensorLabel(tensor), ", which has ",
                   map.TensorRange(tensor).size(), " elements of ", std::string(DTypeName(dtype)),
                   " (", want, " bytes)"));
}

absl::Status OffloadClient::Push(int64_t step, int tensor, absl::Span<const std::byte> data) {
  ZO_RETURN_IF_ERROR(impl_->CheckWholeTensor(tensor, data.size()));
  return impl_->PushRange(step, tensor, 0, data, nullptr);
}

OffloadClient::Traffic OffloadClient::traffic() const {
  return {.pushed_bytes = impl_->pushed_bytes.load(std::memory_order_relaxed),
          .pulled_bytes = impl_->pulled_bytes.load(std::memory_order_relaxed)};
}

absl::Status OffloadClient::PushShared(int64_t step, int tensor, std::shared_ptr<const void> owner,
                                       absl::Span<const std::byte> data, int micro_batch) {
  if (owner == nullptr) {
    return absl::InvalidArgumentError("PushShared needs an owner of the pushed bytes");
  }
  ZO_RETURN_IF_ERROR(impl_->CheckWholeTensor(tensor, data.size()));
  return impl_->PushRange(step, tensor, 0, data, std::move(owner), micro_batch);
}

absl::Status OffloadClient::PushRange(int64_t step, int tensor, int64_t offset,
                                      absl::Span<const std::byte> data) {
  return impl_->PushRange(step, tensor, offset, data, nullptr);
}

absl::Status OffloadClient::FinishStep(int64_t step) { return impl_->FinishStep(step); }

PullCancellation::PullCancellation() : group_(std::make_unique<CallGroup>()) {}
PullCancellation::~PullCancellation() = default;
void PullCancellation::Cancel() { group_->CancelAll(); }
bool PullCancellation::cancelled() const { return group_->cancelled(); }

absl::StatusOr<bool> OffloadClient::Pull(int64_t version, int64_t have_version,
                                         absl::Span<const int> tensors,
                                         absl::Span<const absl::Span<std::byte>> dst,
                                         PullCancellation* cancel) {
  return impl_->Pull(version, have_version, tensors, dst, nullptr,
                     cancel != nullptr ? cancel->group_.get() : nullptr);
}

absl::StatusOr<bool> OffloadClient::PullForStep(int64_t step, absl::Span<const int> tensors,
                                                absl::Span<const absl::Span<std::byte>> dst,
                                                double* loss_scale, PullCancellation* cancel) {
  if (step < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot pull for step ", step, ": steps are numbered from 1"));
  }
  std::lock_guard lock(impl_->pull_for_step_mu);
  int64_t version = VersionForStep(impl_->config.zo.dpu, step);
  {
    // After a restore to v_r the servers hold v_{r-1} only when the
    // checkpoint kept it; otherwise the first step of a resumed DPU run
    // computes on v_r rather than v_{r-1}.
    std::lock_guard state_lock(impl_->state_mu);
    version = std::max(version, impl_->base_version);
  }
  bool changed = false;
  if (version != impl_->pulled_version) {
    absl::StatusOr<bool> pulled =
        impl_->Pull(version, impl_->pulled_version, tensors, dst, &impl_->pulled_loss_scale,
                    cancel != nullptr ? cancel->group_.get() : nullptr);
    if (!pulled.ok()) {
      // A pull that failed half way may have written part of dst.
      impl_->pulled_version = -1;
      return pulled.status();
    }
    changed = *pulled;
    impl_->pulled_version = version;
  }
  if (loss_scale != nullptr) *loss_scale = impl_->pulled_loss_scale;
  return changed;
}

absl::Status OffloadClient::CheckState() const { return impl_->CheckState(); }

std::vector<std::string> OffloadClient::routes() const {
  std::vector<std::string> out;
  for (int s = 0; s < impl_->map.num_servers(); ++s) {
    out.push_back(impl_->routes[s] != nullptr ? "in_process"
                  : impl_->RegionId(s) != 0   ? "shared_memory"
                                              : "grpc");
  }
  return out;
}

double OffloadClient::loss_scale() const {
  std::lock_guard lock(impl_->state_mu);
  return impl_->loss_scale;
}

int64_t OffloadClient::version() const {
  std::lock_guard lock(impl_->state_mu);
  return impl_->version;
}

absl::Status OffloadClient::SetStepLr(int64_t step, absl::Span<const double> group_lr) {
  v1::StepLrRequest request;
  request.set_job(impl_->options.job);
  request.set_step(step);
  request.set_dp_rank(impl_->options.dp_rank);
  for (double lr : group_lr) request.add_group_lr(lr);
  request.set_incarnation(impl_->incarnation[0].load(std::memory_order_relaxed));
  return impl_
      ->Unary<v1::StepLrResponse>(
          0, [&](v1::Offload::Stub& stub, grpc::ClientContext& context,
                 v1::StepLrResponse& r) { return stub.SetStepLr(&context, request, &r); })
      .status();
}

absl::StatusOr<v1::JobStatus> OffloadClient::JobStatus() {
  v1::GetJobStatusRequest request;
  request.set_job(impl_->options.job);
  ZO_ASSIGN_OR_RETURN(
      v1::JobStatus status,
      impl_->Unary<v1::JobStatus>(
          0, [&](v1::Offload::Stub& stub, grpc::ClientContext& context, v1::JobStatus& response) {
            return stub.GetJobStatus(&context, request, &response);
          }));
  impl_->SetStatus(status);
  return status;
}

absl::StatusOr<std::string> OffloadClient::Checkpoint(int64_t min_version) {
  v1::CheckpointRequest request;
  request.set_job(impl_->options.job);
  request.set_min_version(min_version);
  ZO_ASSIGN_OR_RETURN(
      v1::CheckpointResponse response,
      impl_->Unary<v1::CheckpointResponse>(
          0, [&](v1::Offload::Stub& stub, grpc::ClientContext& context, v1::CheckpointResponse& r) {
            return stub.Checkpoint(&context, request, &r);
          }));
  return response.path();
}

absl::StatusOr<int64_t> OffloadClient::Restore(const std::string& path, bool rollback) {
  v1::RestoreRequest request;
  request.set_job(impl_->options.job);
  request.set_path(path);
  request.set_rollback(rollback);
  ZO_ASSIGN_OR_RETURN(const v1::RestoreResponse response, RestoreCall(request));
  return response.version();
}

absl::StatusOr<v1::RestoreResponse> OffloadClient::RestoreOnce(const std::string& path,
                                                               int64_t seen_restores) {
  v1::RestoreRequest request;
  request.set_job(impl_->options.job);
  request.set_path(path);
  request.set_if_restores(seen_restores);
  return RestoreCall(request);
}

absl::StatusOr<v1::RestoreResponse> OffloadClient::RestoreCall(const v1::RestoreRequest& request) {
  const bool rollback = request.rollback();
  ZO_ASSIGN_OR_RETURN(
      v1::RestoreResponse response,
      impl_->Unary<v1::RestoreResponse>(
          0, [&](v1::Offload::Stub& stub, grpc::ClientContext& context, v1::RestoreResponse& r) {
            return stub.Restore(&context, request, &r);
          }));
  // A rollback made a new instance of the job on every server: this
  // client's calls go to it from now on.
  for (int i = 0; rollback && i < impl_->map.num_servers(); ++i) {
    v1::GetJobStatusRequest status_request;
    status_request.set_job(impl_->options.job);
    ZO_ASSIGN_OR_RETURN(
        v1::JobStatus status,
        impl_->Unary<v1::JobStatus>(
            i, [&](v1::Offload::Stub& stub, grpc::ClientContext& context, v1::JobStatus& st) {
              return stub.GetJobStatus(&context, status_request, &st);
            }));
    impl_->incarnation[i] = status.incarnation();
  }
  // A server that restarted holds none of this worker's regions.
  if (rollback && !impl_->regions.empty()) impl_->AttachRegions();
  // Whatever PullForStep put in the caller's buffers is not the restored
  // weights, even at an equal version number.
  std::lock_guard pull_lock(impl_->pull_for_step_mu);
  impl_->pulled_version = -1;
  std::lock_guard state_lock(impl_->state_mu);
  impl_->version = response.version();
  // With a delayed parameter update the checkpoint may have kept the
  // version the next step computes on: then that is the oldest.
  impl_->base_version = response.base_version();
  impl_->lost_state.clear();  // every server holds the restored state now
  return response;
}

}  // namespace zo
