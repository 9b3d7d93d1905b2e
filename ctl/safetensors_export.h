// Exports the fp32 master weights of a committed checkpoint as a Hugging
// Face safetensors file, so a model trained with zo loads with
// `safetensors.torch.load_file` (or transformers) without zo:
//
//   8 bytes      u64 little-endian N, the header's length
//   N bytes      JSON: {"<tensor>": {"dtype": "F32", "shape": [...],
//                "data_offsets": [begin, end]}, ..., "__metadata__": {...}},
//                padded with spaces so that N is a multiple of 8
//   the data     every tensor's floats, little-endian, in manifest order,
//                contiguous (offsets count from the end of the header)
//
// __metadata__ is a string-to-string map (safetensors' rule): "format": "pt",
// "zo_job", "zo_version" (finished steps, the checkpoint's version) and
// "zo_step" (Adam's applied step count).
#ifndef ZO_CTL_SAFETENSORS_EXPORT_H_
#define ZO_CTL_SAFETENSORS_EXPORT_H_

#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace zo {

// What an export wrote.
struct SafetensorsExportSummary {
  int64_t tensors = 0;
  int64_t bytes = 0;  // file size
};

struct SafetensorsExportOptions {
  // Floats read from the checkpoint at a time: the memory an export needs.
  int64_t buffer_elems = int64_t{16} << 20;
  // Called after each tensor with its index in the manifest and its name.
  std::function<void(int64_t tensor, const std::string& name)> progress;
};

// Reads the committed checkpoint in `checkpoint_dir` (checkpoint.json and
// its parts) and writes `out_path` under the temp name `out_path + ".tmp"`,
// fsynced and renamed when complete. Streams tensor by tensor through one
// bounded buffer, never the whole model. Errors: the checkpoint's
// (NOT_FOUND, DATA_LOSS naming the part, chunk and offset, ...) or the
// output file's (RESOURCE_EXHAUSTED for a full disk), with no output file
// left behind; a tensor named "__metadata__" is INVALID_ARGUMENT.
absl::Status ExportMasterToSafetensors(const std::string& checkpoint_dir,
                                       const std::string& out_path);
absl::StatusOr<SafetensorsExportSummary> ExportMasterToSafetensors(
    const std::string& checkpoint_dir, const std::string& out_path,
    const SafetensorsExportOptions& options);

}  // namespace zo

#endif  // ZO_CTL_SAFETENSORS_EXPORT_H_
