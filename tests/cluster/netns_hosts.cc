#include "tests/cluster/netns_hosts.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <tuple>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

extern char** environ;

namespace zo::cluster {
namespace {

// 198.18.0.0/15 holds 512 /24s; one per live NetnsHosts.
constexpr int kSubnets = 512;
constexpr int kFirstHostOctet = 10;
constexpr char kLockDir[] = "/tmp/zo-netns-subnets";

bool ValidName(const std::string& s) {
  if (s.empty() || s.size() > 24) return false;
  for (char c : s) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '_') return false;
  }
  return true;
}

// Kills every process still inside namespace `ns` (grandchildren of ours, or
// those of a run that was killed) so that deleting it frees it.
void KillProcessesIn(const std::string& ns) {
  absl::StatusOr<std::string> pids = RunCommand({"ip", "netns", "pids", ns});
  if (!pids.ok()) return;
  for (absl::string_view line : absl::StrSplit(*pids, '\n', absl::SkipWhitespace())) {
    int pid = 0;
    if (absl::SimpleAtoi(absl::StripAsciiWhitespace(line), &pid) && pid > 1) kill(pid, SIGKILL);
  }
}

void DeleteNamespace(const std::string& ns) {
  KillProcessesIn(ns);
  (void)RunCommand({"ip", "netns", "del", ns});
}

// Deletes "<prefix>-<pid>-..." namespaces whose pid no longer runs: a test
// killed by ctest's timeout never ran its destructors.
void DeleteStaleNamespaces(const std::string& prefix) {
  DIR* dir = opendir("/run/netns");
  if (dir == nullptr) return;
  std::vector<std::string> stale;
  while (dirent* e = readdir(dir)) {
    const std::string name = e->d_name;
    if (name.rfind(prefix + "-", 0) != 0) continue;
    const std::vector<std::string> parts = absl::StrSplit(name.substr(prefix.size() + 1), '-');
    int pid = 0;
    if (parts.size() < 3 || !absl::SimpleAtoi(parts[0], &pid) || pid <= 0) continue;
    if (kill(pid, 0) != 0 && errno == ESRCH) stale.push_back(name);
  }
  closedir(dir);
  for (const std::string& ns : stale) DeleteNamespace(ns);
}

// Takes the first free /24, starting from one that depends on the pid so that
// parallel runs rarely contend. A flock dies with its process: a killed run
// frees its subnet.
absl::StatusOr<std::pair<int, int>> ReserveSubnet() {
  mkdir(kLockDir, 0755);
  for (int i = 0; i < kSubnets; ++i) {
    const int subnet = (getpid() + i) % kSubnets;
    const std::string path = absl::StrCat(kLockDir, "/", subnet, ".lock");
    const int fd = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) return absl::InternalError(absl::StrCat("open ", path, ": ", strerror(errno)));
    if (flock(fd, LOCK_EX | LOCK_NB) == 0) return std::make_pair(subnet, fd);
    close(fd);
  }
  return absl::ResourceExhaustedError("every /24 of 198.18.0.0/15 is held by another run");
}

std::string HostIp(int subnet, int host) {
  return absl::StrCat("198.", 18 + subnet / 256, ".", subnet % 256, ".", kFirstHostOctet + host);
}

}  // namespace

absl::StatusOr<std::string> RunCommand(const std::vector<std::string>& argv) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) return absl::InternalError("pipe failed");
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, fds[1], STDOUT_FILENO);
  posix_spawn_file_actions_adddup2(&actions, fds[1], STDERR_FILENO);
  std::vector<std::string> copy = argv;
  std::vector<char*> args;
  for (std::string& a : copy) args.push_back(a.data());
  args.push_back(nullptr);
  pid_t pid = -1;
  const int spawned = posix_spawnp(&pid, args[0], &actions, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  close(fds[1]);
  std::string out;
  if (spawned == 0) {
    char buf[4096];
    ssize_t n;
    while ((n = read(fds[0], buf, sizeof(buf))) > 0 || (n < 0 && errno == EINTR)) {
      if (n > 0) out.append(buf, static_cast<size_t>(n));
    }
  }
  close(fds[0]);
  const std::string command = absl::StrJoin(argv, " ");
  if (spawned != 0) {
    return absl::InternalError(absl::StrCat("cannot run '", command, "': ", strerror(spawned)));
  }
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    return absl::InternalError(absl::StrCat("'", command, "' exited with ",
                                            WIFEXITED(status) ? WEXITSTATUS(status) : -1, ": ",
                                            absl::StripTrailingAsciiWhitespace(out)));
  }
  return out;
}

absl::StatusOr<std::unique_ptr<NetnsHosts>> NetnsHosts::Create(const std::string& prefix) {
  if (!ValidName(prefix)) return absl::InvalidArgumentError("bad prefix '" + prefix + "'");
  static std::atomic<int> counter{0};
  auto hosts = std::unique_ptr<NetnsHosts>(new NetnsHosts);
  hosts->base_ = absl::StrCat(prefix, "-", getpid(), "-", counter++);
  hosts->switch_netns_ = hosts->base_ + "-sw";
  // The first namespace tells whether this process may make any: anything
  // that fails here is the environment, not the setup.
  if (absl::StatusOr<std::string> made = RunCommand({"ip", "netns", "add", hosts->switch_netns_});
      !made.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot create network namespaces here (needs root or CAP_SYS_ADMIN and "
                     "CAP_NET_ADMIN, and iproute2's ip): ",
                     made.status().message()));
  }
  hosts->namespaces_.push_back(hosts->switch_netns_);
  DeleteStaleNamespaces(prefix);
  auto subnet = ReserveSubnet();
  if (!subnet.ok()) return subnet.status();
  std::tie(hosts->subnet_, hosts->subnet_lock_) = *subnet;
  const std::string& sw = hosts->switch_netns_;
  for (const std::vector<std::string>& command : std::vector<std::vector<std::string>>{
           {"ip", "-n", sw, "link", "add", "br0", "type", "bridge"},
           {"ip", "-n", sw, "link", "set", "br0", "up"}}) {
    if (auto r = RunCommand(command); !r.ok()) return r.status();
  }
  return hosts;
}

NetnsHosts::~NetnsHosts() {
  for (auto& p : processes_) p->Kill();
  for (auto it = namespaces_.rbegin(); it != namespaces_.rend(); ++it) DeleteNamespace(*it);
  if (subnet_lock_ >= 0) close(subnet_lock_);
}

absl::StatusOr<int> NetnsHosts::AddHost(const std::string& name) {
  if (!ValidName(name)) return absl::InvalidArgumentError("bad host name '" + name + "'");
  for (const Host& h : hosts_) {
    if (h.name == name) return absl::InvalidArgumentError("host '" + name + "' exists");
  }
  const int index = size();
  if (kFirstHostOctet + index > 254) return absl::ResourceExhaustedError("a /24 is full");
  Host h{.name = name,
         .netns = base_ + "-" + name,
         .ip = HostIp(subnet_, index),
         .port = absl::StrCat("p", index)};
  if (auto r = RunCommand({"ip", "netns", "add", h.netns}); !r.ok()) return r.status();
  namespaces_.push_back(h.netns);
  // The veth is made in the switch's namespace and its other end moved into
  // the host's: nothing appears in the root namespace, even for a moment.
  for (const std::vector<std::string>& command : std::vector<std::vector<std::string>>{
           {"ip", "-n", switch_netns_, "link", "add", h.port, "type", "veth", "peer", "name",
            "eth0", "netns", h.netns},
           {"ip", "-n", switch_netns_, "link", "set", h.port, "master", "br0", "up"},
           {"ip", "-n", h.netns, "addr", "add", h.ip + "/24", "dev", "eth0"},
           {"ip", "-n", h.netns, "link", "set", "eth0", "up"},
           {"ip", "-n", h.netns, "link", "set", "lo", "up"}}) {
    if (auto r = RunCommand(command); !r.ok()) return r.status();
  }
  hosts_.push_back(std::move(h));
  return index;
}

absl::StatusOr<testing::ChildProcess*> NetnsHosts::Start(int host,
                                                         const std::vector<std::string>& argv,
                                                         const std::string& log_path) {
  std::vector<std::string> args = {"/usr/bin/env", "ip", "netns", "exec", netns(host)};
  args.insert(args.end(), argv.begin(), argv.end());
  // `ip netns exec` execs the command in place, so the pid is the command's
  // and a signal reaches it, not a wrapper.
  absl::StatusOr<testing::ChildProcess> child = testing::ChildProcess::Start(args, log_path);
  if (!child.ok()) return child.status();
  processes_.push_back(std::make_unique<testing::ChildProcess>(*std::move(child)));
  return processes_.back().get();
}

absl::StatusOr<std::string> NetnsHosts::Run(int host, const std::vector<std::string>& argv) {
  std::vector<std::string> args = {"ip", "netns", "exec", netns(host)};
  args.insert(args.end(), argv.begin(), argv.end());
  return RunCommand(args);
}

absl::Status NetnsHosts::SetLink(int host, bool up) {
  return RunCommand(
             {"ip", "-n", switch_netns_, "link", "set", hosts_[host].port, up ? "up" : "down"})
      .status();
}

absl::Status NetnsHosts::LimitLink(int host, int64_t mbit) {
  const std::pair<std::string, std::string> ends[] = {{netns(host), "eth0"},
                                                      {switch_netns_, hosts_[host].port}};
  for (const auto& [ns, dev] : ends) {
    if (mbit <= 0) {
      (void)RunCommand({"tc", "-n", ns, "qdisc", "del", "dev", dev, "root"});  // none: fine
      continue;
    }
    // A bucket of 10 ms of traffic (at least a 64 KiB GSO packet) and up to
    // 100 ms of queue: TCP sees a link of that rate, not one that drops.
    const int64_t burst = std::max<int64_t>(64 << 10, mbit * 1000000 / 8 / 100);
    auto r =
        RunCommand({"tc", "-n", ns, "qdisc", "replace", "dev", dev, "root", "tbf", "rate",
                    absl::StrCat(mbit, "mbit"), "burst", absl::StrCat(burst), "latency", "100ms"});
    if (!r.ok()) return r.status();
  }
  return absl::OkStatus();
}

}  // namespace zo::cluster
