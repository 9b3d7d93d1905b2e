#include "bench/fio.h"

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"
#include "offload/io/io_error.h"

extern char** environ;

namespace zo::bench {
namespace {

struct ProcessResult {
  int wait_status = 0;
  std::string out;  // everything the child wrote to stdout
};

// Runs argv with stdout captured and stderr shared with ours.
absl::StatusOr<ProcessResult> RunCapturingStdout(const std::vector<std::string>& args) {
  std::vector<char*> argv;
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  int pipe_fds[2];
  if (pipe2(pipe_fds, O_CLOEXEC) != 0) return ZO_ERRNO_STATUS(errno, "pipe for " + args[0]);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, pipe_fds[1], STDOUT_FILENO);
  pid_t pid = 0;
  const int err = posix_spawnp(&pid, argv[0], &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  close(pipe_fds[1]);
  if (err != 0) {
    close(pipe_fds[0]);
    if (err == ENOENT) {
      return absl::FailedPreconditionError(absl::StrCat(
          "cannot run '", args[0], "': not found (apt-get install fio, or --fio PATH)"));
    }
    return ZO_ERRNO_STATUS(err, "cannot run " + args[0]);
  }
  ProcessResult result;
  char buf[1 << 16];
  for (;;) {
    const ssize_t n = read(pipe_fds[0], buf, sizeof(buf));
    if (n > 0) {
      result.out.append(buf, static_cast<size_t>(n));
    } else if (n == 0 || errno != EINTR) {
      break;
    }
  }
  close(pipe_fds[0]);
  while (waitpid(pid, &result.wait_status, 0) < 0) {
    if (errno != EINTR) return ZO_ERRNO_STATUS(errno, "waitpid for " + args[0]);
  }
  return result;
}

std::string DescribeWaitStatus(int status) {
  if (WIFEXITED(status)) return absl::StrCat("exit status ", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return absl::StrCat("signal ", WTERMSIG(status));
  return absl::StrCat("wait status ", status);
}

}  // namespace

std::vector<std::string> FioArgs(const FioJob& job) {
  std::vector<std::string> args = {job.binary,
                                   "--output-format=json",
                                   "--name=zo-bench-" + job.rw,
                                   "--filename=" + job.filename,
                                   "--rw=" + job.rw,
                                   absl::StrCat("--bs=", job.bs),
                                   absl::StrCat("--iodepth=", job.iodepth),
                                   absl::StrCat("--size=", job.size),
                                   "--ioengine=" + job.ioengine,
                                   "--direct=1",
                                   "--numjobs=1"};
  args.insert(args.end(), job.extra_args.begin(), job.extra_args.end());
  return args;
}

absl::StatusOr<FioResult> ParseFioJson(const std::string& text, const std::string& rw) {
  const size_t begin = text.find('{');
  const size_t end = text.rfind('}');
  if (begin == std::string::npos || end == std::string::npos || end < begin) {
    return absl::InvalidArgumentError("fio printed no JSON report: '" + text.substr(0, 200) + "'");
  }
  const nlohmann::json report =
      nlohmann::json::parse(text.begin() + begin, text.begin() + end + 1, nullptr, false);
  if (report.is_discarded()) {
    return absl::InvalidArgumentError("fio's report is not valid JSON");
  }
  const auto jobs = report.find("jobs");
  if (jobs == report.end() || !jobs->is_array() || jobs->size() != 1 || !(*jobs)[0].is_object()) {
    return absl::InvalidArgumentError("fio's report does not hold exactly one job");
  }
  const nlohmann::json& job = (*jobs)[0];
  if (const int error = job.value("error", 0); error != 0) {
    return absl::InternalError(
        absl::StrCat("fio job failed with error ", error, " (", std::strerror(error), ")"));
  }
  const auto dir = job.find(rw);
  if (dir == job.end() || !dir->is_object()) {
    return absl::InvalidArgumentError("fio's report has no '" + rw + "' section");
  }
  for (const char* key : {"io_bytes", "runtime", "bw_bytes"}) {
    const auto it = dir->find(key);
    if (it == dir->end() || !it->is_number()) {
      return absl::InvalidArgumentError(absl::StrCat("fio's report has no number ", rw, ".", key));
    }
  }
  FioResult r;
  r.io_bytes = (*dir)["io_bytes"].get<uint64_t>();
  r.runtime_ms = (*dir)["runtime"].get<uint64_t>();
  r.bytes_per_s = (*dir)["bw_bytes"].get<double>();
  if (r.io_bytes == 0 || r.runtime_ms == 0) {
    return absl::InternalError(absl::StrCat("fio moved no ", rw, " bytes"));
  }
  return r;
}

absl::StatusOr<FioResult> RunFio(const FioJob& job) {
  const std::vector<std::string> args = FioArgs(job);
  ZO_ASSIGN_OR_RETURN(ProcessResult run, RunCapturingStdout(args));
  if (!WIFEXITED(run.wait_status) || WEXITSTATUS(run.wait_status) != 0) {
    return absl::InternalError(absl::StrCat("'", absl::StrJoin(args, " "), "' failed (",
                                            DescribeWaitStatus(run.wait_status),
                                            "): ", run.out.substr(0, 2000)));
  }
  ZO_ASSIGN_OR_RETURN(FioResult r, ParseFioJson(run.out, job.rw));
  if (r.io_bytes != job.size) {
    return absl::InternalError(absl::StrCat("fio moved ", r.io_bytes, " bytes, asked for ",
                                            job.size, ": '", absl::StrJoin(args, " "), "'"));
  }
  return r;
}

absl::StatusOr<std::string> FioVersion(const std::string& binary) {
  ZO_ASSIGN_OR_RETURN(ProcessResult run, RunCapturingStdout({binary, "--version"}));
  std::string version = run.out;
  while (!version.empty() && std::isspace(static_cast<unsigned char>(version.back()))) {
    version.pop_back();
  }
  if (!WIFEXITED(run.wait_status) || WEXITSTATUS(run.wait_status) != 0 || version.empty()) {
    return absl::FailedPreconditionError(absl::StrCat("'", binary, " --version' failed (",
                                                      DescribeWaitStatus(run.wait_status), ")"));
  }
  return version;
}

absl::StatusOr<uint64_t> ParseByteSize(const std::string& text) {
  size_t digits = 0;
  while (digits < text.size() && std::isdigit(static_cast<unsigned char>(text[digits]))) {
    ++digits;
  }
  std::string suffix = text.substr(digits);
  for (char& c : suffix) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  const auto bad = [&](const std::string& why) {
    return absl::InvalidArgumentError("not a size: '" + text + "' (" + why + ")");
  };
  uint64_t n = 0;
  if (digits == 0 || !absl::SimpleAtoi(text.substr(0, digits), &n) || n == 0) {
    return bad("want a positive integer, optionally with K, M, G, T or Ki, MiB, ...");
  }
  int shift = 0;
  if (!suffix.empty()) {
    const size_t unit = std::string("kmgt").find(suffix[0]);
    const std::string rest = suffix.substr(1);
    if (unit == std::string::npos || !(rest.empty() || rest == "i" || rest == "ib")) {
      return bad(rest == "b" ? "ambiguous: write " + text.substr(0, text.size() - 1) + " or " +
                                   text.substr(0, text.size() - 1) + "iB, powers of 1024"
                             : "unknown unit; K, M, G, T are powers of 1024");
    }
    shift = 10 * static_cast<int>(unit + 1);
  }
  if (n > (uint64_t{1} << 62) >> shift) return bad("too large");
  return n << shift;
}

}  // namespace zo::bench
