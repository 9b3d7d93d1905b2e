// zo-ctl: the operator's command-line tool. Subcommands:
//   estimate     memory per GPU, per server RAM and per server NVMe
//   export       a checkpoint's fp32 master weights as a safetensors file
//   status       a job's state on one server (GetJobStatus)
//   checkpoint   checkpoint a job now (Checkpoint, to the lead server)
//   jobs         the jobs on one or more servers (GetServerInfo, GetJobStatus)
//   close        close a job on all its servers (CloseJob)
//   restore      roll a job back to a checkpoint on all its servers (Restore,
//                to the lead)
//   rescale      move a running job to other servers (Checkpoint with freeze,
//                CloseJob with where it went, AdoptJob on the new lead)
// Exit status: 0 done, 1 the operation failed (server unreachable, an RPC
// or an export failed), 2 the command line is wrong (a missing or bad flag,
// an unreadable --config, --auth-token-file or --tls-ca).
#include <iostream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/usage.h"
#include "common/command_line.h"
#include "ctl/commands.h"

ABSL_FLAG(bool, json, false,
          "estimate, status, checkpoint, jobs, close: print JSON instead of text");

namespace zo::ctl {
namespace {

constexpr char kUsage[] =
    "operate a zo offload deployment.\n\n"
    "usage: zo-ctl <command> [flags]\n\n"
    "commands:\n"
    "  estimate    memory per GPU, per server RAM and per server NVMe, e.g.\n"
    "              zo-ctl estimate --params 13B --pipeline-stages 4 --servers 2 --nvme\n"
    "  export      write a checkpoint's fp32 master weights as a safetensors file, e.g.\n"
    "              zo-ctl export --checkpoint /ckpt/gpt2/step-00001000 --out gpt2.safetensors\n"
    "  status      a job's state on one server, e.g.\n"
    "              zo-ctl status --server 127.0.0.1:7070 --job gpt2 [--json]\n"
    "  checkpoint  have the lead server checkpoint a job now, e.g.\n"
    "              zo-ctl checkpoint --server 127.0.0.1:7070 --job gpt2 --timeout 600\n"
    "  jobs        the jobs on servers: version, part, memory, state, e.g.\n"
    "              zo-ctl jobs --server 10.0.0.1:7070,10.0.0.2:7070\n"
    "  close       close a job on every server it has, freeing its RAM and swap files, e.g.\n"
    "              zo-ctl close --server 127.0.0.1:7070 --job gpt2 [--delete-checkpoints]\n"
    "  restore     roll a job back to a checkpoint on every server it has (a lost job, or with\n"
    "              --force a live one); its workers follow, e.g.\n"
    "              zo-ctl restore --server 127.0.0.1:7070 --job gpt2 [--checkpoint DIR] [--force]\n"
    "  rescale     move a running job to other servers: checkpoint, restore there; its\n"
    "              workers follow without a restart, e.g.\n"
    "              zo-ctl rescale --server 10.0.0.1:7070 --job gpt2 --servers 10.0.0.1:7070,"
    "10.0.0.2:7070\n\n"
    "status, checkpoint, jobs, close, restore and rescale take --auth-token-file and --tls-ca\n"
    "as the servers need.\n"
    "Exit status: 0 done, 1 the operation failed, 2 a wrong command line.\n"
    "Flags may be written with dashes or underscores.";

int Main(int argc, char** argv) {
  std::vector<std::string> storage;
  std::vector<char*> positional = ParseFlags(argc, argv, kUsage, "ctl/", storage);
  if (positional.size() != 2) {
    std::cerr << "zo-ctl: " << absl::ProgramUsageMessage() << "\n";
    return 2;
  }
  const std::string command = positional[1];
  if (command == "estimate") return RunEstimate();
  if (command == "export") return RunExport();
  if (command == "status") return RunStatus();
  if (command == "checkpoint") return RunCheckpoint();
  if (command == "jobs") return RunJobs();
  if (command == "close") return RunClose();
  if (command == "restore") return RunRestore();
  if (command == "rescale") return RunRescale();
  std::cerr << "zo-ctl: unknown command '" << command << "'; try zo-ctl --help\n";
  return 2;
}

}  // namespace
}  // namespace zo::ctl

int main(int argc, char** argv) { return zo::ctl::Main(argc, argv); }
