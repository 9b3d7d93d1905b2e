// Typed failures: a status that another component acts on carries a
// v1::ErrorDetail as its payload, and the component reads the payload, never
// the message. ToGrpcStatus/FromGrpcStatus carry it across the wire in the
// status details; WithContext/WithMessage (common/status_context.h) keep it
// when a failure is told again with more words.
//
//   return WithDetail(absl::NotFoundError("no job ..."),
//                     MakeDetail(v1::ErrorDetail::NO_JOB, name));
//   if (ReasonOf(status) == v1::ErrorDetail::NO_JOB) ...
#ifndef ZO_RPC_ERROR_DETAIL_H_
#define ZO_RPC_ERROR_DETAIL_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "common/status_context.h"
#include "proto/zo/v1/error.pb.h"

namespace zo {

// The payload's key: the type URL an Any of an ErrorDetail has.
inline constexpr char kErrorDetailUrl[] = "type.googleapis.com/zo.v1.ErrorDetail";

// A detail of `reason` about `job` (and `version`, where the reason has one).
v1::ErrorDetail MakeDetail(v1::ErrorDetail::Reason reason, absl::string_view job,
                           int64_t version = 0);

// `status` with `detail` as its payload (replacing one it had). OK stays OK.
absl::Status WithDetail(absl::Status status, const v1::ErrorDetail& detail);

// The detail a status carries; nullopt for OK and for untyped failures.
std::optional<v1::ErrorDetail> DetailOf(const absl::Status& status);

// REASON_UNSPECIFIED where there is no detail.
v1::ErrorDetail::Reason ReasonOf(const absl::Status& status);

// The failure as a client relays one server's answer: "server <server>: "
// before the message, and the detail's `server` set where it has none.
absl::Status FromServer(absl::string_view server, const absl::Status& status);

// Tests set ZO_TESTING_REWORD_ERRORS=1 to have every message that leaves a
// server or a client call replaced by a meaningless one (code and payloads
// kept): recovery that still works then reads no message. Off otherwise.
bool RewordErrorsForTesting();
absl::Status RewordedForTesting(const absl::Status& status);

}  // namespace zo

#endif  // ZO_RPC_ERROR_DETAIL_H_
