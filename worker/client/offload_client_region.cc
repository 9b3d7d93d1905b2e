// OffloadClient's same-host route: its shared-memory regions, attached to
// the servers on this host, and the pushes through them.
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "common/stream_copy.h"
#include "rpc/call_context.h"
#include "worker/client/internal/offload_client_impl.h"
#include "worker/client/internal/piece_encoding.h"
#include "worker/client/internal/push_stream.h"
#include "worker/client/offload_client.h"

namespace zo {
namespace {

using client_internal::AwaitRegionAck;
using client_internal::CopyThreads;
using client_internal::kLocalPartBytes;
using client_internal::PushCall;
using client_internal::PushStream;
using client_internal::RegionCredits;
using client_internal::WorkerRegion;

}  // namespace

void OffloadClient::Impl::AttachRegions() {
  const int num_servers = map.num_servers();
  if (regions.empty()) {
    regions.resize(num_servers);
    region_ids = std::make_unique<std::atomic<uint64_t>[]>(num_servers);
    region_batches = std::make_unique<std::atomic<bool>[]>(num_servers);
    region_pull_mu = std::make_unique<std::mutex[]>(num_servers);
    region_push_mu = std::make_unique<std::mutex[]>(num_servers);
    region_lent = std::make_unique<std::atomic<bool>[]>(num_servers);
    region_credits.resize(num_servers);
    region_area_step.assign(num_servers, {0, 0});
    pulled_through.assign(num_servers, 0);
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
    region_batches[s] = attached->batched_ranges();
    region_ids[s] = attached->region();
    ZO_LOG(INFO) << "server " << names[s]
                 << ": gradients and weights go through shared memory (same host)";
  }
}

std::optional<OffloadClient::Impl::LocalRun> OffloadClient::Impl::LocalRunOf(int tensor) const {
  const std::vector<TensorPiece> pieces = map.PiecesOfTensor(tensor);
  if (pieces.empty()) return std::nullopt;
  const int server = pieces[0].server;
  int64_t first = -1;
  int64_t next = -1;
  for (const TensorPiece& p : pieces) {
    const int64_t local = LocalElement(p.chunk, p.chunk_offset);
    if (p.server != server || (next >= 0 && local != next)) return std::nullopt;
    if (first < 0) first = local;
    next = local + p.length;
  }
  return LocalRun{.server = server, .first = first, .elems = next - first};
}

std::optional<OffloadClient::Impl::LocalRun> OffloadClient::Impl::RegionRunOf(int tensor) const {
  std::optional<LocalRun> run = LocalRunOf(tensor);
  if (run.has_value() && RegionId(run->server) == 0) run.reset();
  return run;
}

std::optional<std::pair<int, absl::Span<std::byte>>> OffloadClient::Impl::RegionPlace(
    int tensor) const {
  const std::optional<LocalRun> run = RegionRunOf(tensor);
  if (!run.has_value()) return std::nullopt;
  const WorkerRegion& r = *regions[run->server];
  return std::make_pair(
      run->server, absl::Span<std::byte>(r.base() + r.WeightsAreaOffset() + run->first * elem_bytes,
                                         static_cast<size_t>(run->elems * elem_bytes)));
}

bool OffloadClient::Impl::PullsIntoRegionPlaces(
    const client_internal::PullReceiver& receiver) const {
  for (int t : receiver.tensors()) {
    const auto place = RegionPlace(t);
    if (!place.has_value() || place->second.data() != receiver.dst(t).data()) return false;
  }
  return true;
}

std::vector<absl::Span<std::byte>> OffloadClient::RegionPullBuffers(
    absl::Span<const int> tensors, std::shared_ptr<const void>* keeper) {
  Impl& impl = *impl_;
  std::vector<absl::Span<std::byte>> buffers;
  std::vector<int> servers;
  for (int t : tensors) {
    if (!impl.CheckTensorIndex(t).ok()) return {};
    if (impl.map.TensorRange(t).size() == 0) {
      buffers.emplace_back();  // nothing to pull
      continue;
    }
    const auto place = impl.RegionPlace(t);
    if (!place.has_value()) return {};
    buffers.push_back(place->second);
    servers.push_back(place->first);
  }
  auto mapped = std::make_shared<std::vector<std::shared_ptr<const WorkerRegion>>>();
  for (int s : servers) {
    impl.region_lent[s] = true;
    mapped->push_back(impl.regions[s]);
  }
  if (keeper != nullptr) *keeper = std::move(mapped);
  return buffers;
}

void OffloadClient::Impl::DropRegion(int server, const absl::Status& why) {
  if (region_ids == nullptr || region_ids[server].exchange(0) == 0) return;
  ZO_LOG(WARNING) << "server " << names[server]
                  << ": gradients and weights go over gRPC from now on (" << why.message() << ")";
}

absl::Status OffloadClient::Impl::AwaitOlderRegionCalls(int64_t step, const std::set<int>& servers,
                                                        absl::Time deadline) {
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
  for (auto& [s, c] : older) {
    if (!c->WaitFor(std::max(deadline - absl::Now(), absl::ZeroDuration()))) {
      return absl::FailedPreconditionError(absl::StrCat(
          "server ", names[s], ": step ", step,
          "'s gradients would overwrite, in the shared region, those of a step two before it that "
          "are still being pushed: finish that step (FinishStep) first"));
    }
  }
  std::lock_guard lock(mu);
  for (int s : servers) {
    auto& calls = region_calls[s];
    for (auto it = calls.begin(); it != calls.end() && it->first <= step - 2;) {
      it = it->second->WaitFor(absl::ZeroDuration()) ? calls.erase(it) : std::next(it);
    }
  }
  return absl::OkStatus();
}

absl::Status OffloadClient::Impl::PushThroughRegions(int64_t step,
                                                     const std::vector<RegionPiece>& pieces) {
  std::set<int> servers;
  for (const RegionPiece& p : pieces) servers.insert(p.server);
  // Pushes of one micro-batch never write the same bytes; of two may, and
  // then the later must see the earlier's pieces among the credits before
  // it writes (taken in server order: no two pushes wait on each other).
  std::vector<std::unique_lock<std::mutex>> writing;
  if (PushesPerRank(config) > 1) {
    for (int s : servers) writing.emplace_back(region_push_mu[s]);
  }
  const absl::Time deadline = absl::Now() + call_timeout();
  ZO_RETURN_IF_ERROR(AwaitOlderRegionCalls(step, servers, deadline));
  // The pieces of this step whose bytes these overwrite must be summed:
  // per server, the last sent of them (the server sums in order).
  std::map<int, RegionCredits::Writer> overwritten;
  {
    std::lock_guard lock(mu);
    for (const RegionPiece& p : pieces) {
      const int64_t begin = p.header.region_offset();
      std::optional<RegionCredits::Writer> w =
          region_credits[p.server].LastWriter(step, begin, begin + p.header.region_bytes());
      if (!w.has_value()) continue;
      auto [it, added] = overwritten.emplace(p.server, *w);
      if (!added && RegionCredits::SentAfter(w->seq, it->second.seq)) it->second = *w;
    }
  }
  for (const auto& [s, writer] : overwritten) {
    ZO_RETURN_IF_ERROR(AwaitRegionAck(regions[s]->AckSlot(step), writer, deadline, names[s]));
  }
  // The copies, in parts of at least kLocalPartBytes, on several threads.
  struct Part {
    std::byte* dst;
    const std::byte* src;
    size_t n;
  };
  std::vector<Part> parts;
  for (const RegionPiece& p : pieces) {
    if (p.data.data() == p.dst) {  // written in place (PushBuffers)
      pushed_in_place_bytes.fetch_add(static_cast<int64_t>(p.data.size()),
                                      std::memory_order_relaxed);
      continue;
    }
    const auto bytes = static_cast<int64_t>(p.data.size());
    const int64_t k = std::clamp<int64_t>(bytes / kLocalPartBytes, 1, CopyThreads());
    const int64_t part = ((bytes / elem_bytes + k - 1) / k) * elem_bytes;
    for (int64_t at = 0; at < bytes; at += part) {
      parts.push_back(
          {p.dst + at, p.data.data() + at, static_cast<size_t>(std::min(part, bytes - at))});
    }
  }
  const int threads = static_cast<int>(std::min<int64_t>(parts.size(), CopyThreads()));
  // Past the cache: the server's core reads the region, not this one, and
  // one core writes about twice as fast without reading each line first.
  auto copy_every = [&](int first) {
    for (size_t i = first; i < parts.size(); i += threads) {
      if (parts[i].n >= kStreamCopyMinBytes) {
        StreamCopy(parts[i].src, parts[i].dst, parts[i].n);
      } else {
        std::memcpy(parts[i].dst, parts[i].src, parts[i].n);
      }
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
    std::shared_ptr<PushCall>& stream = streams[step][{p.server, 0}];
    if (stream == nullptr) {
      stream = std::make_shared<PushStream>(channels[p.server], names[p.server], step,
                                            NewCallContext(call.attempt), &budget, &stream_ends,
                                            region_batches[p.server].load());
      region_calls[p.server][step] = stream;
    }
    v1::GradientPiece header = p.header;
    const int64_t begin = header.region_offset();
    header.set_region_ack(
        region_credits[p.server].Wrote(step, begin, begin + header.region_bytes(), stream));
    header.set_region_ack_offset(regions[p.server]->AckOffset(step));
    ZO_RETURN_IF_ERROR(
        static_cast<PushStream&>(*stream).Enqueue(client_internal::EncodeRegionPiece(header)));
  }
  return absl::OkStatus();
}

}  // namespace zo
