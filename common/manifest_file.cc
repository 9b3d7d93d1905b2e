#include "common/manifest_file.h"

#include <cstdint>
#include <fstream>
#include <limits>
#include <sstream>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace zo {
namespace {

absl::Status Bad(size_t index, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat("manifest tensors[", index, "]: ", what));
}

}  // namespace

absl::StatusOr<std::vector<TensorSpec>> ParseManifestJson(const std::string& text) {
  const nlohmann::json doc = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) return absl::InvalidArgumentError("manifest is not valid JSON");
  if (!doc.is_object() || !doc.contains("tensors") || !doc["tensors"].is_array()) {
    return absl::InvalidArgumentError("manifest must be an object with a \"tensors\" array");
  }
  std::vector<TensorSpec> specs;
  const nlohmann::json& tensors = doc["tensors"];
  for (size_t i = 0; i < tensors.size(); ++i) {
    const nlohmann::json& t = tensors[i];
    if (!t.is_object()) return Bad(i, "must be an object");
    TensorSpec spec;
    if (!t.contains("name") || !t["name"].is_string()) return Bad(i, "\"name\" must be a string");
    spec.name = t["name"].get<std::string>();
    if (!t.contains("shape") || !t["shape"].is_array()) {
      return Bad(i, absl::StrCat("'", spec.name, "': \"shape\" must be an array of integers"));
    }
    // Bounded as ShardMap bounds a tensor (2^62 elements), counting the
    // nonzero dimensions, so that a caller may multiply the shape
    // (NumElements, zo-ctl estimate) without overflow.
    int64_t nonzero = 1;
    for (const nlohmann::json& d : t["shape"]) {
      if (!d.is_number_integer()) {
        return Bad(i,
                   absl::StrCat("'", spec.name, "': shape entry ", d.dump(), " is not an integer"));
      }
      const int64_t dim = d.is_number_unsigned() && d.get<uint64_t>() > INT64_MAX
                              ? -1  // reported as negative: no int64 holds it
                              : d.get<int64_t>();
      if (dim < 0) {
        return Bad(i, absl::StrCat("'", spec.name, "': shape entry ", d.dump(), " is negative"));
      }
      if (dim != 0 && nonzero > (int64_t{1} << 62) / dim) {
        return Bad(i, absl::StrCat("'", spec.name, "': more than 2^62 elements"));
      }
      if (dim != 0) nonzero *= dim;
      spec.shape.push_back(dim);
    }
    if (t.contains("dtype")) {
      const auto dtype =
          t["dtype"].is_string() ? ParseDType(t["dtype"].get<std::string>()) : std::nullopt;
      if (!dtype) {
        return Bad(i, absl::StrCat("'", spec.name, "': dtype ", t["dtype"].dump(),
                                   " is not one of fp32, fp16, bf16"));
      }
      spec.dtype = *dtype;
    }
    if (t.contains("group")) {
      if (!t["group"].is_number_integer() || t["group"].get<int64_t>() < 0 ||
          t["group"].get<int64_t>() > std::numeric_limits<int>::max()) {
        return Bad(i, absl::StrCat("'", spec.name, "': group ", t["group"].dump(),
                                   " is not a parameter group index"));
      }
      spec.group = t["group"].get<int>();
    }
    specs.push_back(std::move(spec));
  }
  // Names are validated where they are used (ShardMap::Create).
  return specs;
}

absl::StatusOr<std::vector<TensorSpec>> LoadManifestFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open manifest file ", path));
  std::stringstream text;
  text << in.rdbuf();
  auto specs = ParseManifestJson(text.str());
  if (!specs.ok()) {
    return absl::Status(specs.status().code(), absl::StrCat(path, ": ", specs.status().message()));
  }
  return specs;
}

}  // namespace zo
