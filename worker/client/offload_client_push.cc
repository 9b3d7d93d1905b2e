// OffloadClient's pushes: gradients (over gRPC or the in-process route;
// the same-host route is offload_client_region.cc), FinishStep, and the
// initial weights.
#include <algorithm>
#include <bit>
#include <memory>
#include <mutex>
#include <set>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "rpc/call_context.h"
#include "rpc/error_detail.h"
#include "rpc/proto_convert.h"
#include "worker/client/internal/call.h"
#include "worker/client/internal/local_push_call.h"
#include "worker/client/internal/offload_client_impl.h"
#include "worker/client/internal/piece_encoding.h"
#include "worker/client/internal/push_stream.h"
#include "worker/client/offload_client.h"

namespace zo {
namespace {

using client_internal::CallGroup;
using client_internal::CopyThreads;
using client_internal::kLocalPartBytes;
using client_internal::LocalPushCall;
using client_internal::PushCall;
using client_internal::PushStream;
using client_internal::RetryCall;
using client_internal::RunInParallel;
using client_internal::WorkerRegion;

// A piece over the in-process route is a chunk's part of a push, whole:
// the server takes it from the caller's memory, so nothing bounds it but
// the chunk.
constexpr int64_t kMaxLocalPieceBytes = int64_t{1} << 62;

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

absl::Status OffloadClient::Impl::StepErrorLocked(int64_t step) const {
  auto it = streams.find(step);
  if (it == streams.end()) return absl::OkStatus();
  for (const auto& [lane, stream] : it->second) {
    if (absl::Status s = stream->status(); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status OffloadClient::Impl::CheckPushRange(int64_t step, int tensor, int64_t offset,
                                                 int64_t bytes, int micro_batch) const {
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
  return absl::OkStatus();
}

int64_t OffloadClient::Impl::MaxPushPieceBytes() const {
  // The in-process and same-host routes take a chunk's part whole; gRPC's
  // messages are cut at max_piece_bytes.
  bool whole_chunks = true;
  for (int s = 0; s < map.num_servers(); ++s) {
    whole_chunks = whole_chunks && (routes[s] != nullptr || GradientsThroughRegion(s));
  }
  return whole_chunks ? kMaxLocalPieceBytes : options.max_piece_bytes;
}

v1::GradientPiece OffloadClient::Impl::PushHeader(int64_t step, const PushPiece& p,
                                                  int micro_batch) const {
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
  return header;
}

absl::Status OffloadClient::Impl::RoutePushPiece(int64_t step, const PushPiece& p,
                                                 v1::GradientPiece header,
                                                 absl::Span<const std::byte> data,
                                                 const std::shared_ptr<const void>& owner,
                                                 bool in_place, bool lend, RoutedPush& routed) {
  if (routes[p.server] != nullptr) {
    // Lent, little is copied: one part.
    AddLocalParts(LocalPushCallFor(step, p.server), p, header, data, in_place || lend,
                  routed.local);
    return absl::OkStatus();
  }
  if (GradientsThroughRegion(p.server)) {
    bool area_free = false;
    {
      std::lock_guard lock(mu);
      area_free = RegionAreaFreeLocked(p.server, step);
      if (area_free) region_area_step[p.server][step % 2] = step;
    }
    // Else the server may still read the step two before there: no pull
    // has shown its update over (a worker that pushes without pulling).
    if (!area_free) return EnqueueOnStream(step, p, header, data, owner);
    // The server reads the piece where it lies, not copying it: the area
    // is written again only once the step's update is over (above).
    header.set_region_lent(true);
    routed.in_region.push_back(InRegion(step, p, RegionId(p.server), std::move(header), data));
    return absl::OkStatus();
  }
  return EnqueueOnStream(step, p, header, data, owner);
}

std::shared_ptr<PushCall> OffloadClient::Impl::LocalPushCallFor(int64_t step, int server) {
  // Found under mu; pushed through unlocked, so pushes of several
  // threads convert in parallel. A FinishStep meanwhile closes the
  // call, and this push then fails as a late one.
  std::lock_guard lock(mu);
  std::shared_ptr<PushCall>& slot = streams[step][{server, 0}];
  if (slot == nullptr) {
    slot = std::make_shared<LocalPushCall>(routes[server], names[server], step,
                                           absl::Now() + call_timeout(), &budget, &stream_ends);
  }
  return slot;
}

void OffloadClient::Impl::AddLocalParts(const std::shared_ptr<PushCall>& call, const PushPiece& p,
                                        const v1::GradientPiece& header,
                                        absl::Span<const std::byte> data, bool in_place,
                                        std::vector<LocalPiece>& local) const {
  const int64_t piece_bytes = p.byte_end - p.byte_begin;
  // A big piece is handed over in parts by several threads: one thread
  // cannot draw the memory bandwidth a copy wants. In place, nothing is
  // copied.
  const int64_t parts =
      in_place ? 1 : std::clamp<int64_t>(piece_bytes / kLocalPartBytes, 1, CopyThreads());
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
}

OffloadClient::Impl::RegionPiece OffloadClient::Impl::InRegion(
    int64_t step, const PushPiece& p, uint64_t region, v1::GradientPiece header,
    absl::Span<const std::byte> data) const {
  const int64_t piece_bytes = p.byte_end - p.byte_begin;
  const WorkerRegion& r = *regions[p.server];
  const int64_t at =
      r.GradientAreaOffset(step) + LocalElement(p.chunk, p.chunk_offset) * elem_bytes;
  header.set_region(region);
  header.set_region_offset(at);
  header.set_region_bytes(piece_bytes);
  return {.server = p.server,
          .header = std::move(header),
          .data = data.subspan(static_cast<size_t>(p.byte_begin), static_cast<size_t>(piece_bytes)),
          .dst = r.base() + at};
}

absl::Status OffloadClient::Impl::EnqueueOnStream(int64_t step, const PushPiece& p,
                                                  const v1::GradientPiece& header,
                                                  absl::Span<const std::byte> data,
                                                  const std::shared_ptr<const void>& owner) {
  const int64_t piece_bytes = p.byte_end - p.byte_begin;
  budget.Acquire(step, piece_bytes);
  client_internal::EncodedPiece piece = client_internal::EncodeGradientPiece(
      header, data.data() + p.byte_begin, static_cast<size_t>(piece_bytes), owner);

  // Enqueue under mu, so that FinishStep cannot take the stream away
  // between finding it and queuing on it.
  std::lock_guard lock(mu);
  const int connection = ConnectionOf(p.server, p.chunk);
  std::shared_ptr<PushCall>& stream = streams[step][{p.server, connection}];
  if (stream == nullptr) {
    stream =
        std::make_shared<PushStream>(data_channels[p.server][connection], names[p.server], step,
                                     NewCallContext(call.attempt), &budget, &stream_ends);
  }
  return static_cast<PushStream&>(*stream).Enqueue(std::move(piece));
}

absl::Status OffloadClient::Impl::PushLocal(const std::vector<LocalPiece>& local,
                                            const std::shared_ptr<const void>& owner, bool lend) {
  const int threads = lend ? 1 : static_cast<int>(std::min<int64_t>(local.size(), CopyThreads()));
  std::vector<absl::Status> results(threads);
  auto push_every = [&](int first) {
    for (size_t i = first; i < local.size() && results[first].ok(); i += threads) {
      results[first] = static_cast<LocalPushCall&>(*local[i].call)
                           .Push(local[i].header, local[i].data, owner, lend);
    }
  };
  std::vector<std::thread> helpers;
  for (int t = 1; t < threads; ++t) helpers.emplace_back(push_every, t);
  push_every(0);
  for (std::thread& t : helpers) t.join();
  for (absl::Status& r : results) ZO_RETURN_IF_ERROR(r);
  return absl::OkStatus();
}

absl::Status OffloadClient::Impl::PushRange(int64_t step, int tensor, int64_t offset,
                                            absl::Span<const std::byte> data,
                                            std::shared_ptr<const void> owner, int micro_batch,
                                            bool lend) {
  ZO_RETURN_IF_ERROR(CheckState());
  const int64_t bytes = static_cast<int64_t>(data.size());
  ZO_RETURN_IF_ERROR(CheckPushRange(step, tensor, offset, bytes, micro_batch));
  const int64_t elems = bytes / elem_bytes;
  // The tensor's gradient places were lent (PushBuffers): pushed from
  // there, nothing is copied; from other bytes into a region, they go over
  // gRPC, so that nothing but the lent bytes is written over the lent ones
  // (an embedded server copies them into its own buffer, as any push).
  bool in_place = false;
  bool lent_elsewhere = false;
  {
    std::lock_guard lock(mu);
    ZO_RETURN_IF_ERROR(StepErrorLocked(step));
    if (auto lent = push_lent.find(step); lent != push_lent.end()) {
      if (auto place = lent->second.find(tensor); place != lent->second.end()) {
        in_place = data.data() == place->second + offset * elem_bytes;
        lent_elsewhere = !in_place;
      }
    }
  }
  RoutedPush routed;
  const int64_t max_piece = lent_elsewhere ? options.max_piece_bytes : MaxPushPieceBytes();
  for (const PushPiece& p : PlanPush(map, tensor, offset, elems, elem_bytes, max_piece)) {
    v1::GradientPiece header = PushHeader(step, p, micro_batch);
    if (lent_elsewhere && GradientsThroughRegion(p.server)) {
      ZO_RETURN_IF_ERROR(EnqueueOnStream(step, p, header, data, owner));
      continue;
    }
    ZO_RETURN_IF_ERROR(
        RoutePushPiece(step, p, std::move(header), data, owner, in_place, lend, routed));
  }
  if (in_place) {
    // The in-process route's pieces lie where the accumulator keeps them (the
    // same-host route's are counted as they are sent).
    for (const LocalPiece& piece : routed.local) {
      pushed_in_place_bytes.fetch_add(static_cast<int64_t>(piece.data.size()),
                                      std::memory_order_relaxed);
    }
  }
  if (!routed.in_region.empty()) ZO_RETURN_IF_ERROR(PushThroughRegions(step, routed.in_region));
  if (!routed.local.empty()) ZO_RETURN_IF_ERROR(PushLocal(routed.local, owner, lend));
  pushed_bytes.fetch_add(bytes, std::memory_order_relaxed);
  return absl::OkStatus();
}

absl::StatusOr<absl::Span<std::byte>> OffloadClient::Impl::LocalGradientPlace(int64_t step,
                                                                              int tensor) {
  const std::optional<LocalRun> run = LocalRunOf(tensor);
  if (!run.has_value() || routes[run->server] == nullptr) return absl::Span<std::byte>();
  const int server = run->server;
  std::byte* first = nullptr;
  std::byte* next = nullptr;
  for (const TensorPiece& t : map.PiecesOfTensor(tensor)) {
    const PushPiece p{.server = server, .chunk = t.chunk, .chunk_offset = t.chunk_offset};
    ZO_ASSIGN_OR_RETURN(const absl::Span<std::byte> place,
                        routes[server]->LendGradientPlace(PushHeader(step, p, 0), t.length));
    // The server keeps them in its local order, as the run's.
    if (place.empty() || (next != nullptr && place.data() != next)) return absl::Span<std::byte>();
    if (first == nullptr) first = place.data();
    next = place.data() + place.size();
  }
  return absl::Span<std::byte>(first, static_cast<size_t>(next - first));
}

absl::StatusOr<std::vector<absl::Span<std::byte>>> OffloadClient::PushBuffers(
    int64_t step, absl::Span<const int> tensors, std::shared_ptr<const void>* keeper) {
  Impl& impl = *impl_;
  ZO_RETURN_IF_ERROR(impl.CheckState());
  if (step < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot lend step ", step, "'s gradient places: steps are numbered from 1"));
  }
  for (int t : tensors) ZO_RETURN_IF_ERROR(impl.CheckTensorIndex(t));
  // Micro-batches summed on the servers write the same places one after
  // another: each copy waits there for the server to have summed the one
  // before, which a buffer written before its push could not.
  if (PushesPerRank(impl.config) > 1) return std::vector<absl::Span<std::byte>>();
  if (keeper != nullptr) {
    for (int t : tensors) {
      if (impl.map.TensorRange(t).size() > 0 && !impl.RegionRunOf(t).has_value()) {
        return std::vector<absl::Span<std::byte>>();
      }
    }
  }
  std::vector<absl::Span<std::byte>> buffers;
  std::set<int> region_servers;
  for (int t : tensors) {
    if (impl.map.TensorRange(t).size() == 0) {
      buffers.emplace_back();  // nothing to push
      continue;
    }
    ZO_ASSIGN_OR_RETURN(absl::Span<std::byte> place, impl.LocalGradientPlace(step, t));
    if (place.empty()) {
      const std::optional<Impl::LocalRun> run = impl.RegionRunOf(t);
      if (!run.has_value()) return std::vector<absl::Span<std::byte>>();
      {
        std::lock_guard lock(impl.mu);
        if (!impl.RegionAreaFreeLocked(run->server, step)) {
          return std::vector<absl::Span<std::byte>>();  // its pushes take gRPC
        }
      }
      place = {impl.GradientPlace(step, run->server, run->first),
               static_cast<size_t>(run->elems * impl.elem_bytes)};
      region_servers.insert(run->server);
    }
    buffers.push_back(place);
  }
  if (!region_servers.empty()) {
    {
      std::lock_guard lock(impl.mu);
      for (const auto& [lent_step, lent] : impl.push_lent) {
        if (lent_step <= step - 2 && !lent.empty()) {
          return absl::FailedPreconditionError(
              absl::StrCat("step ", step,
                           "'s gradient places in the shared region are those of step ", lent_step,
                           ", whose lent places are still in use: finish that step (FinishStep) "
                           "first"));
        }
      }
    }
    // The bytes are written before the push: what the push would wait for
    // before its copy, this waits for before lending them.
    ZO_RETURN_IF_ERROR(
        impl.AwaitOlderRegionCalls(step, region_servers, absl::Now() + impl.call_timeout()));
  }
  if (keeper != nullptr) {
    auto mapped =
        std::make_shared<std::vector<std::shared_ptr<const client_internal::WorkerRegion>>>();
    for (int s : region_servers) mapped->push_back(impl.regions[s]);
    *keeper = std::move(mapped);
  }
  std::lock_guard lock(impl.mu);
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (!buffers[i].empty()) impl.push_lent[step][tensors[i]] = buffers[i].data();
  }
  return buffers;
}

absl::Status OffloadClient::Impl::FinishStep(int64_t step) {
  ZO_RETURN_IF_ERROR(CheckState());
  std::map<PushLane, std::shared_ptr<PushCall>> open;
  {
    std::lock_guard lock(mu);
    push_lent.erase(step);
    auto it = streams.find(step);
    if (it == streams.end()) return absl::OkStatus();
    open = std::move(it->second);
    streams.erase(it);
  }
  absl::Time look_again = absl::InfiniteFuture();
  for (auto& [lane, stream] : open) {
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
      for (auto& [lane, stream] : open) {
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
    for (auto& [lane, stream] : open) {
      if (stream->WaitFor(absl::ZeroDuration()) &&
          ReasonOf(stream->status()) == v1::ErrorDetail::UNKNOWN_REGION) {
        DropRegion(lane.first, failed);
      }
    }
  }
  // The step cannot be finished now: the other calls are ended here rather
  // than at their deadline. (A server that lost its lead keeps a push for
  // the next step waiting until then, and the worker would wait with it
  // before it could go and look for the job again.)
  for (auto& [lane, stream] : open) {
    if (!stream->WaitFor(absl::ZeroDuration())) stream->Cancel();
  }
  for (auto& [lane, stream] : open) stream->WaitFor(absl::InfiniteDuration());
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

absl::Status OffloadClient::PushShared(int64_t step, int tensor, std::shared_ptr<const void> owner,
                                       absl::Span<const std::byte> data, int micro_batch) {
  if (owner == nullptr) {
    return absl::InvalidArgumentError("PushShared needs an owner of the pushed bytes");
  }
  ZO_RETURN_IF_ERROR(impl_->CheckWholeTensor(tensor, data.size()));
  return impl_->PushRange(step, tensor, 0, data, std::move(owner), micro_batch);
}

absl::Status OffloadClient::PushLent(int64_t step, int tensor, std::shared_ptr<const void> owner,
                                     absl::Span<const std::byte> data) {
  if (owner == nullptr) {
    return absl::InvalidArgumentError("PushLent needs an owner of the pushed bytes");
  }
  ZO_RETURN_IF_ERROR(impl_->CheckWholeTensor(tensor, data.size()));
  // A delayed update's worker computes the next step before the servers
  // update this one: its gradient buffers may be written meanwhile.
  return impl_->PushRange(step, tensor, 0, data, std::move(owner), /*micro_batch=*/0,
                          /*lend=*/!impl_->config.zo.dpu.enabled);
}

absl::Status OffloadClient::PushRange(int64_t step, int tensor, int64_t offset,
                                      absl::Span<const std::byte> data) {
  return impl_->PushRange(step, tensor, offset, data, nullptr);
}

absl::Status OffloadClient::FinishStep(int64_t step) { return impl_->FinishStep(step); }

}  // namespace zo
