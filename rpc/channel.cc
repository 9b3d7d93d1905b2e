#include "rpc/channel.h"

#include <cstdlib>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "common/host_port.h"
#include "common/status_macros.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/support/channel_arguments.h"

namespace zo {

void SeeConnectsPromptly() {
  static std::once_flag once;
  std::call_once(once, [] {
    // gRPC reads it once, at its first initialisation; an operator's own
    // setting stays.
    setenv("GRPC_CLIENT_CHANNEL_BACKUP_POLL_INTERVAL_MS", "100", /*overwrite=*/0);
  });
}

absl::StatusOr<std::shared_ptr<grpc::Channel>> NewChannel(const std::string& address,
                                                          const ChannelOptions& options) {
  SeeConnectsPromptly();
  ZO_RETURN_IF_ERROR(ParseHostPort(address, PortUse::kConnect).status());
  if (options.max_message_bytes < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_message_bytes must be >= 1, got ", options.max_message_bytes));
  }
  if (options.ping_every < absl::Milliseconds(1) ||
      options.ping_answered_within < absl::Milliseconds(1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("pings must be at least 1 ms apart and given at least 1 ms, got every ",
                     absl::FormatDuration(options.ping_every), ", answered within ",
                     absl::FormatDuration(options.ping_answered_within)));
  }
  grpc::ChannelArguments args;
  args.SetMaxSendMessageSize(options.max_message_bytes);
  args.SetMaxReceiveMessageSize(options.max_message_bytes);
  // A connection of the channel's own rather than one shared with every
  // channel of the process to the same address (gRPC's global subchannel
  // pool): dp ranks or tests that live in one process then do not squeeze
  // their gradients through one TCP connection.
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  // BDP probing (gRPC's default, kept explicitly) grows the HTTP/2 windows to
  // the link's bandwidth-delay product, which long gradient streams need.
  args.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 1);
  // After a failed connect gRPC waits before the next one, by default up to
  // 120 s; calls meanwhile fail at once. Cap it near the client's retry
  // backoff so that a retry window covers a server restart.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 2000);
  // Keepalive sets TCP_USER_TIMEOUT to its timeout as well. Without calls
  // open nothing waits, so nothing pings; with them, every ping counts
  // (gRPC's default stops after two pings without data).
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, PingArgMs(options.ping_every));
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, PingArgMs(options.ping_answered_within));
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 0);
  args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  std::shared_ptr<grpc::ChannelCredentials> credentials =
      options.tls_root_certs.empty() ? grpc::InsecureChannelCredentials()
                                     : grpc::SslCredentials(grpc::SslCredentialsOptions{
                                           .pem_root_certs = options.tls_root_certs,
                                           .pem_private_key = "",
                                           .pem_cert_chain = ""});
  return grpc::CreateCustomChannel(address, credentials, args);
}

}  // namespace zo
