#include "worker/client/offload_client.h"

#include <algorithm>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "common/logging.h"
#include "worker/client/internal/offload_client_impl.h"

namespace zo {
namespace {

using client_internal::PushCall;

// How long the destructor lets unfinished pushes end before cancelling them.
constexpr absl::Duration kCloseGrace = absl::Seconds(5);

}  // namespace

OffloadClient::Impl::~Impl() {
  std::map<int64_t, std::map<PushLane, std::shared_ptr<PushCall>>> open;
  {
    std::lock_guard lock(mu);
    open.swap(streams);
  }
  for (auto& [step, by_lane] : open) {
    for (auto& [lane, stream] : by_lane) stream->Close();
  }
  const absl::Time give_up = absl::Now() + kCloseGrace;
  for (auto& [step, by_lane] : open) {
    for (auto& [lane, stream] : by_lane) {
      if (!stream->WaitFor(std::max(give_up - absl::Now(), absl::ZeroDuration()))) {
        ZO_LOG(WARNING) << "cancelling the unfinished gradient push of step " << step
                        << " to server " << names[lane.first];
        stream->Cancel();
      } else if (absl::Status s = stream->status(); !s.ok()) {
        ZO_LOG(WARNING) << "gradient push of step " << step << " was never finished: " << s;
      }
    }
  }
  // The streams' destructors join their threads.
}

OffloadClient::OffloadClient(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
OffloadClient::~OffloadClient() = default;

const ShardMap& OffloadClient::shard_map() const { return impl_->map; }
const Config& OffloadClient::config() const { return impl_->config; }

OffloadClient::Traffic OffloadClient::traffic() const {
  return {.pushed_bytes = impl_->pushed_bytes.load(std::memory_order_relaxed),
          .pulled_bytes = impl_->pulled_bytes.load(std::memory_order_relaxed),
          .pushed_in_place_bytes = impl_->pushed_in_place_bytes.load(std::memory_order_relaxed)};
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

}  // namespace zo
