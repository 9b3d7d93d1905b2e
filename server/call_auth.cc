#include "server/call_auth.h"

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
