// Hosts as Linux network namespaces on one machine, for multi-host tests and
// benchmarks. Each host is a namespace with one interface, eth0, whose veth
// peer is a port of a bridge (the "switch") that lives in a namespace of its
// own, so the machine's root namespace is never touched. Hosts get addresses
// in a /24 of 198.18.0.0/15 (RFC 2544's benchmark range) that no other live
// NetnsHosts holds. Processes run in a host through `ip netns exec`.
//
// Names are "<prefix>-<pid>-<n>-sw" for the switch and "<prefix>-<pid>-<n>-<host>"
// for the hosts, so two test processes (ctest -j) never collide; namespaces
// that a killed run left behind (its pid gone) are deleted by the next
// Create with the same prefix.
#ifndef ZO_TESTS_CLUSTER_NETNS_HOSTS_H_
#define ZO_TESTS_CLUSTER_NETNS_HOSTS_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "tests/support/child_process.h"

namespace zo::cluster {

// Runs argv (argv[0] looked up on PATH) to completion: its stdout and
// stderr together, or INTERNAL naming the command, its exit code and output.
absl::StatusOr<std::string> RunCommand(const std::vector<std::string>& argv);

// Not thread-safe: one thread sets the hosts up, starts processes and tears
// everything down.
class NetnsHosts {
 public:
  // The switch's namespace and bridge. FAILED_PRECONDITION, saying why, when
  // this process cannot create network namespaces (not root, no
  // CAP_SYS_ADMIN / CAP_NET_ADMIN, no `ip`): callers skip then. Other errors
  // are failures of the setup itself.
  static absl::StatusOr<std::unique_ptr<NetnsHosts>> Create(const std::string& prefix = "zo");

  // Kills every process started in a host, then deletes the namespaces
  // (which removes the veths and the bridge) and frees the subnet.
  ~NetnsHosts();
  NetnsHosts(const NetnsHosts&) = delete;
  NetnsHosts& operator=(const NetnsHosts&) = delete;

  // A new host `name` (letters, digits, '_'; unique here): its namespace,
  // lo and eth0 up, eth0 plugged into the switch. Returns its index.
  absl::StatusOr<int> AddHost(const std::string& name);

  int size() const { return static_cast<int>(hosts_.size()); }
  const std::string& name(int host) const { return hosts_[host].name; }
  const std::string& netns(int host) const { return hosts_[host].netns; }
  // The host's IPv4 address, e.g. "198.18.3.11".
  const std::string& ip(int host) const { return hosts_[host].ip; }
  // The switch's namespace (where the hosts' switch ports live).
  const std::string& switch_netns() const { return switch_netns_; }

  // Starts argv (argv[0] a path) in `host`, stdout and stderr to `log_path`.
  // This object owns the process and kills it at the latest when it is
  // destroyed; the pointer stays valid until then.
  absl::StatusOr<testing::ChildProcess*> Start(int host, const std::vector<std::string>& argv,
                                               const std::string& log_path);
  // Runs argv in `host` to completion, as RunCommand.
  absl::StatusOr<std::string> Run(int host, const std::vector<std::string>& argv);

  // Pulls (false) or plugs (true) the cable of `host`: its switch port goes
  // down or up; the host's own eth0 keeps its state and address.
  absl::Status SetLink(int host, bool up);
  // Caps `host`'s link at `mbit` megabits per second each way (a token
  // bucket on both ends of its veth); 0 removes the caps.
  absl::Status LimitLink(int host, int64_t mbit);

 private:
  struct Host {
    std::string name;
    std::string netns;
    std::string ip;
    std::string port;  // the switch-side veth, in switch_netns_
  };

  NetnsHosts() = default;

  std::string base_;  // "<prefix>-<pid>-<n>"
  std::string switch_netns_;
  int subnet_ = -1;                      // index of the /24 in 198.18.0.0/15
  int subnet_lock_ = -1;                 // flock'd file that reserves subnet_
  std::vector<std::string> namespaces_;  // created ones, deleted in reverse
  std::vector<Host> hosts_;
  std::vector<std::unique_ptr<testing::ChildProcess>> processes_;
};

}  // namespace zo::cluster

#endif  // ZO_TESTS_CLUSTER_NETNS_HOSTS_H_
