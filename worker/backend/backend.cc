#include "worker/backend/backend.h"

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

}  // namespace zo::backend
