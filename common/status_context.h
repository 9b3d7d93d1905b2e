// A failure told again with more words: the same code and payloads (a
// v1::ErrorDetail that a client acts on, rpc/error_detail.h), a new message.
// absl::Status(s.code(), StrCat(..., s.message())) drops the payloads; use
// these wherever a status that may carry one is passed on.
#ifndef ZO_COMMON_STATUS_CONTEXT_H_
#define ZO_COMMON_STATUS_CONTEXT_H_

#include <string>

#include "absl/status/status.h"
#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace zo {

// `status` with `message` instead of its own. OK stays OK.
inline absl::Status WithMessage(const absl::Status& status, absl::string_view message) {
  if (status.ok()) return status;
  absl::Status out(status.code(), message);
  status.ForEachPayload(
      [&](absl::string_view url, const absl::Cord& payload) { out.SetPayload(url, payload); });
  return out;
}

// "<context>: <message>".
inline absl::Status WithContext(const absl::Status& status, absl::string_view context) {
  if (status.ok()) return status;
  return WithMessage(status, absl::StrCat(context, ": ", status.message()));
}

}  // namespace zo

#endif  // ZO_COMMON_STATUS_CONTEXT_H_
