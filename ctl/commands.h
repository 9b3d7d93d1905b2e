// zo-ctl's subcommands, each reading its own flags (defined beside it) and
// returning the exit status: 0 done, 1 the operation failed, 2 the command
// line is wrong.
#ifndef ZO_CTL_COMMANDS_H_
#define ZO_CTL_COMMANDS_H_

#include <string>

#include "absl/flags/declare.h"

// Shared by estimate, status, checkpoint, jobs and close; defined in ctl/zo_ctl_main.cc.
ABSL_DECLARE_FLAG(bool, json);
// estimate: a count; rescale: a list. Defined in ctl/estimate_command.cc.
ABSL_DECLARE_FLAG(std::string, servers);
// export, rescale, restore. Defined in ctl/export_command.cc.
ABSL_DECLARE_FLAG(std::string, checkpoint);

namespace zo::ctl {

int RunEstimate();    // ctl/estimate_command.cc
int RunExport();      // ctl/export_command.cc
int RunStatus();      // ctl/rpc_commands.cc
int RunCheckpoint();  // ctl/rpc_commands.cc
int RunJobs();        // ctl/rpc_commands.cc
int RunClose();       // ctl/rpc_commands.cc
int RunRestore();     // ctl/rpc_commands.cc
int RunRescale();     // ctl/rescale_command.cc

}  // namespace zo::ctl

#endif  // ZO_CTL_COMMANDS_H_
