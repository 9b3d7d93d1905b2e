// zo-ctl export: a checkpoint's fp32 master weights as a safetensors file
// (ctl/safetensors_export.h).
#include <cstdint>
#include <fstream>
#include <iostream>
#include <string>

#include "absl/flags/flag.h"
#include "absl/status/statusor.h"
#include "common/units.h"
#include "ctl/commands.h"
#include "ctl/safetensors_export.h"
#include "offload/checkpoint/checkpoint_dir.h"

ABSL_FLAG(std::string, checkpoint, "",
          "export: a committed checkpoint directory (<root>/<job>/step-N), or a job's "
          "directory (<root>/<job>) for its latest checkpoint; rescale: adopt the job from this "
          "committed checkpoint on --servers (finishing a rescale that stopped half way); restore: "
          "the committed checkpoint to restore (default: the job's latest)");
ABSL_FLAG(std::string, out, "", "export: the safetensors file to write");

namespace zo::ctl {
namespace {

// --checkpoint as given, or the latest checkpoint when it names a job's
// directory (one without a checkpoint.json of its own).
std::string ResolveCheckpointDir(const std::string& dir) {
  std::string trimmed = dir;
  while (trimmed.size() > 1 && trimmed.back() == '/') trimmed.pop_back();
  if (std::ifstream(trimmed + "/checkpoint.json").good()) return trimmed;
  const size_t slash = trimmed.find_last_of('/');
  const std::string root = slash == std::string::npos ? "." : trimmed.substr(0, slash);
  const std::string job = slash == std::string::npos ? trimmed : trimmed.substr(slash + 1);
  absl::StatusOr<std::string> latest = LatestCheckpoint(root, job);
  return latest.ok() ? *latest : trimmed;  // else the export names `dir` in its error
}

}  // namespace

int RunExport() {
  const std::string checkpoint = absl::GetFlag(FLAGS_checkpoint);
  const std::string out = absl::GetFlag(FLAGS_out);
  if (checkpoint.empty() || out.empty()) {
    std::cerr << "zo-ctl export: give --checkpoint DIR and --out FILE.safetensors\n";
    return 2;
  }
  const std::string dir = ResolveCheckpointDir(checkpoint);
  int64_t count = 0;
  if (absl::StatusOr<CheckpointMeta> meta = ReadCheckpointMeta(dir); meta.ok()) {
    count = static_cast<int64_t>(meta->manifest.size());
    std::cerr << "zo-ctl export: " << dir << ": job " << meta->job << ", version " << meta->version
              << ", " << count << " tensor(s)\n";
  }
  SafetensorsExportOptions options;
  options.progress = [count](int64_t t, const std::string& name) {
    std::cerr << "zo-ctl export: [" << t + 1 << "/" << count << "] " << name << "\n";
  };
  absl::StatusOr<SafetensorsExportSummary> summary = ExportMasterToSafetensors(dir, out, options);
  if (!summary.ok()) {
    std::cerr << "zo-ctl export: " << summary.status().message() << "\n";
    return 1;
  }
  std::cout << "exported " << summary->tensors << " tensor(s), " << summary->bytes << " bytes ("
            << FormatBytes(static_cast<double>(summary->bytes)) << ") to " << out << "\n";
  return 0;
}

}  // namespace zo::ctl
