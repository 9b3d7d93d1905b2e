#include "worker/backend/backend.h"

#include <condition_variable>
#include <mutex>
#include <utility>

namespace zo::backend {

std::shared_ptr<std::byte> Backend::AllocateHost(size_t bytes) {
  return std::shared_ptr<std::byte>(new std::byte[bytes], std::default_delete<std::byte[]>());
}

void Backend::DownloadAsync(const Tensor& src, absl::Span<std::byte> dst,
                            std::function<void(absl::Status)> done) {
  done(Download(src, dst));
}

void Backend::UploadAsync(absl::Span<const std::byte> src, Tensor& dst,
                          std::function<void(absl::Status)> done) {
  done(Upload(src, dst));
}

absl::Status UploadAll(Backend& backend, absl::Span<const absl::Span<const std::byte>> host,
                       absl::Span<Tensor* const> dst) {
  std::mutex mu;
  std::condition_variable done;
  size_t left = dst.size();
  absl::Status first;
  for (size_t i = 0; i < dst.size(); ++i) {
    backend.UploadAsync(host[i], *dst[i], [&](absl::Status s) {
      std::lock_guard<std::mutex> lock(mu);
      if (!s.ok() && first.ok()) first = s;
      if (--left == 0) done.notify_all();
    });
  }
  std::unique_lock<std::mutex> lock(mu);
  done.wait(lock, [&] { return left == 0; });
  return first;
}

}  // namespace zo::backend
