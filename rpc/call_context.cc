#include "rpc/call_context.h"

#include "rpc/rpc_util.h"

namespace zo {

void PrepareCallContext(const CallOptions& options, grpc::ClientContext& context) {
  context.set_deadline(absl::ToChronoTime(absl::Now() + options.timeout));
  if (!options.auth_token.empty()) {
    context.AddMetadata(kAuthMetadataKey, BearerValue(options.auth_token));
  }
}

std::unique_ptr<grpc::ClientContext> NewCallContext(const CallOptions& options) {
  auto context = std::make_unique<grpc::ClientContext>();
  PrepareCallContext(options, *context);
  return context;
}

}  // namespace zo
