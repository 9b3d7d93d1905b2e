// A model manifest as a JSON file, for tools that size or inspect a job
// without the model's code (zo-ctl estimate):
//
//   {"tensors": [{"name": "wte", "shape": [50304, 768], "dtype": "fp16"}, ...]}
//
// "dtype" is optional (fp16).
#ifndef ZO_COMMON_MANIFEST_FILE_H_
#define ZO_COMMON_MANIFEST_FILE_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/sharding.h"

namespace zo {

// INVALID_ARGUMENT names the offending tensor and field; NOT_FOUND the path.
absl::StatusOr<std::vector<TensorSpec>> ParseManifestJson(const std::string& text);
absl::StatusOr<std::vector<TensorSpec>> LoadManifestFile(const std::string& path);

}  // namespace zo

#endif  // ZO_COMMON_MANIFEST_FILE_H_
