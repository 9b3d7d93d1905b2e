#include "tests/cluster/server_host.h"

#include <unistd.h>

#include <chrono>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "tests/cluster/wait_until.h"

namespace zo::cluster {

absl::StatusOr<HostServer> StartServerOnHost(NetnsHosts& hosts, int host, const std::string& binary,
                                             const std::string& dir,
                                             const std::vector<std::string>& extra_args, int port) {
  const std::string address = absl::StrCat(hosts.ip(host), ":", port);
  const std::string base = absl::StrCat(dir, "/", hosts.name(host), "_", port);
  const std::string port_file = base + ".port";
  unlink(port_file.c_str());
  std::vector<std::string> args = {binary, "--listen", address, "--port-file", port_file};
  args.insert(args.end(), extra_args.begin(), extra_args.end());
  absl::StatusOr<testing::ChildProcess*> process = hosts.Start(host, args, base + ".log");
  if (!process.ok()) return process.status();
  // zo-server renames the port file into place once it listens.
  const absl::Status listening = WaitUntil(
      "zo-server on " + hosts.name(host) + " to listen",
      [&] {
        int bound = 0;
        std::ifstream in(port_file);
        return static_cast<bool>(in >> bound) && bound > 0;
      },
      dir, {*process}, std::chrono::seconds(30));
  if (!listening.ok()) {
    return absl::Status(listening.code(),
                        absl::StrCat(listening.message(), "\n", (*process)->ReadLog()));
  }
  return HostServer{.process = *process, .address = address};
}

}  // namespace zo::cluster
