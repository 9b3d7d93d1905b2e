// zo-server on a NetnsHosts host: it listens on the host's own address at
// kServerPort, as it would on a machine of its own.
#ifndef ZO_TESTS_CLUSTER_SERVER_HOST_H_
#define ZO_TESTS_CLUSTER_SERVER_HOST_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "tests/cluster/netns_hosts.h"
#include "tests/support/child_process.h"

namespace zo::cluster {

inline constexpr int kServerPort = 7070;

struct HostServer {
  testing::ChildProcess* process = nullptr;  // owned by the NetnsHosts
  std::string address;                       // "ip:port"
};

// Starts `binary` (a zo-server) in `host` with `extra_args`, its log and
// port file in `dir` (named after the host and port), and waits (at most 30 s) until it listens.
absl::StatusOr<HostServer> StartServerOnHost(NetnsHosts& hosts, int host, const std::string& binary,
                                             const std::string& dir,
                                             const std::vector<std::string>& extra_args = {},
                                             int port = kServerPort);

}  // namespace zo::cluster

#endif  // ZO_TESTS_CLUSTER_SERVER_HOST_H_
