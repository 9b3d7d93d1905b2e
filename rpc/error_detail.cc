#include "rpc/error_detail.h"

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <utility>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"

namespace zo {

v1::ErrorDetail MakeDetail(v1::ErrorDetail::Reason reason, absl::string_view job, int64_t version) {
  v1::ErrorDetail detail;
  detail.set_reason(reason);
  detail.set_job(std::string(job));
  detail.set_version(version);
  return detail;
}

absl::Status WithDetail(absl::Status status, const v1::ErrorDetail& detail) {
  if (status.ok()) return status;
  status.SetPayload(kErrorDetailUrl, absl::Cord(detail.SerializeAsString()));
  return status;
}

std::optional<v1::ErrorDetail> DetailOf(const absl::Status& status) {
  const auto payload = status.GetPayload(kErrorDetailUrl);
  if (!payload.has_value()) return std::nullopt;
  v1::ErrorDetail detail;
  if (!detail.ParseFromString(std::string(*payload))) return std::nullopt;
  return detail;
}

v1::ErrorDetail::Reason ReasonOf(const absl::Status& status) {
  const std::optional<v1::ErrorDetail> detail = DetailOf(status);
  return detail.has_value() ? detail->reason() : v1::ErrorDetail::REASON_UNSPECIFIED;
}

absl::Status FromServer(absl::string_view server, const absl::Status& status) {
  if (status.ok()) return status;
  absl::Status out = RewordedForTesting(WithContext(status, absl::StrCat("server ", server)));
  std::optional<v1::ErrorDetail> detail = DetailOf(out);
  if (detail.has_value() && detail->server().empty()) {
    detail->set_server(std::string(server));
    out = WithDetail(std::move(out), *detail);
  }
  return out;
}

bool RewordErrorsForTesting() {
  static const bool reword = [] {
    const char* v = std::getenv("ZO_TESTING_REWORD_ERRORS");
    return v != nullptr && v[0] == '1';
  }();
  return reword;
}

absl::Status RewordedForTesting(const absl::Status& status) {
  if (status.ok() || !RewordErrorsForTesting()) return status;
  // Different words every time a message passes, so no text survives.
  static std::atomic<uint64_t> n{0};
  return WithMessage(status, absl::StrCat("reworded for a test #", n.fetch_add(1)));
}

}  // namespace zo
