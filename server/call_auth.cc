#include "server/call_auth.h"

#include "absl/time/clock.h"
#include "common/logging.h"
#include "rpc/rpc_util.h"

namespace zo {
namespace {

bool ConstantTimeEquals(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

}  // namespace

absl::Status CallAuth::Check(const grpc::ServerContextBase& context) const {
  absl::Status refused = CheckToken(context);
  if (refused.ok()) return refused;
  const std::string host = PeerHost(context.peer());
  const AuthFailures::Verdict v = failures_.Record(host, absl::Now());
  if (v.log) {
    ZO_LOG(WARNING) << "refused a call from " << host << ": " << refused.message() << " ("
                    << v.failures << " refused from there in the last minute"
                    << (v.delay > absl::ZeroDuration() ? "; answering them slowly" : "") << ")";
  }
  if (v.delay > absl::ZeroDuration()) {
    absl::SleepFor(v.delay);
    failures_.DoneWaiting();
  }
  return refused;
}

absl::Status CallAuth::CheckToken(const grpc::ServerContextBase& context) const {
  if (token_.empty()) return absl::OkStatus();
  const auto& metadata = context.client_metadata();
  auto it = metadata.find(kAuthMetadataKey);
  if (it == metadata.end()) {
    return absl::UnauthenticatedError("this server requires a token (authorization: Bearer ...)");
  }
  const std::string value(it->second.data(), it->second.size());
  if (!ConstantTimeEquals(value, BearerValue(token_))) {
    return absl::UnauthenticatedError("wrong token");
  }
  return absl::OkStatus();
}

}  // namespace zo
