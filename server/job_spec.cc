#include "server/job_spec.h"

#include <algorithm>
#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"

namespace zo {
namespace {

bool ValidJobName(const std::string& name) {
  if (name.empty() || name.size() > 128) return false;
  for (char c : name) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '.' || c == '_' || c == '-';
    if (!ok) return false;
  }
  return name != "." && name != "..";
}

// "/optimizer/params/betas/1" -> "optimizer.params.betas[1]".
std::string KeyPath(const std::string& pointer) {
  std::string path;
  for (const absl::string_view part : absl::StrSplit(pointer, '/', absl::SkipEmpty())) {
    const bool index = std::all_of(part.begin(), part.end(), absl::ascii_isdigit);
    if (index) {
      absl::StrAppend(&path, "[", part, "]");
    } else {
      absl::StrAppend(&path, path.empty() ? "" : ".", part);
    }
  }
  return path;
}

// Every key whose value differs, with both values: "fp16.enabled is true, the
// job's is false". Compares the configs as ConfigToJson writes them, so
// defaults count and spelling does not.
std::string ConfigDifferences(const Config& job, const Config& request) {
  using Json = nlohmann::json;
  const Json a = Json::parse(ConfigToJson(job)).flatten();
  const Json b = Json::parse(ConfigToJson(request)).flatten();
  std::vector<std::string> diffs;
  auto value = [](const Json& flat, const std::string& key) {
    const auto it = flat.find(key);
    return it == flat.end() ? std::string("absent") : it->dump();
  };
  std::set<std::string> keys;
  for (const auto& [key, v] : a.items()) keys.insert(key);
  for (const auto& [key, v] : b.items()) keys.insert(key);
  for (const std::string& key : keys) {
    const std::string x = value(a, key);
    const std::string y = value(b, key);
    if (x != y) diffs.push_back(absl::StrCat(KeyPath(key), " is ", y, ", the job's is ", x));
  }
  if (diffs.empty()) return "the config differs from the job's";
  return absl::StrCat("config ", absl::StrJoin(diffs, "; "));
}

}  // namespace

absl::StatusOr<JobSpec> JobSpecFromRequest(const v1::OpenJobRequest& request) {
  JobSpec spec;
  spec.name = request.job();
  spec.init_fingerprint = request.init_fingerprint();
  if (!ValidJobName(spec.name)) {
    return absl::InvalidArgumentError(
        absl::StrCat("job name \"", spec.name, "\" is not 1 to 128 characters of [A-Za-z0-9._-]"));
  }
  if (request.dp_world_size() < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("dp_world_size = ", request.dp_world_size(), ": must be >= 1"));
  }
  spec.dp_world_size = request.dp_world_size();
  spec.servers.assign(request.servers().begin(), request.servers().end());
  if (spec.servers.empty()) return absl::InvalidArgumentError("servers: the list is empty");
  if (std::set<std::string>(spec.servers.begin(), spec.servers.end()).size() !=
      spec.servers.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("servers: duplicate address in [", absl::StrJoin(spec.servers, ", "), "]"));
  }
  if (request.server_index() < 0 ||
      request.server_index() >= static_cast<int>(spec.servers.size())) {
    return absl::InvalidArgumentError(absl::StrCat("server_index = ", request.server_index(),
                                                   ": outside the ", spec.servers.size(),
                                                   "-server list"));
  }
  spec.server_index = request.server_index();

  spec.config_json = request.config_json();
  absl::StatusOr<LoadedConfig> loaded =
      ParseConfig(spec.config_json, {.dp_world_size = spec.dp_world_size});
  if (!loaded.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("config_json: ", loaded.status().message()));
  }
  spec.config = std::move(loaded->config);
  // How many connections a worker opens is its own affair: workers of one
  // job may differ, and a restarted one may choose again.
  spec.config.zo.connections_per_server = ZoConfig::kDefaultConnectionsPerServer;
  // A worker resolves "auto" before it opens a job; a client that does not
  // (zo.torch, tests) pushes once per step, which is "device".
  GradientAccumulation& policy = spec.config.zo.gradient_accumulation;
  if (policy == GradientAccumulation::kAuto) policy = GradientAccumulation::kDevice;
  const OptimizerType opt = spec.config.optimizer.type;
  if (opt != OptimizerType::kAdam && opt != OptimizerType::kAdamW) {
    return absl::UnimplementedError(
        absl::StrCat("optimizer ", std::string(EnumName(opt)), ": zo-server runs Adam and AdamW"));
  }
  spec.dtype = spec.config.fp16.enabled   ? DType::kFloat16
               : spec.config.bf16.enabled ? DType::kBFloat16
                                          : DType::kFloat32;

  if (request.manifest().tensors_size() == 0) {
    return absl::InvalidArgumentError("manifest: no tensors");
  }
  if (request.manifest().tensors_size() > kMaxManifestTensors) {
    return absl::InvalidArgumentError(absl::StrCat("manifest: ", request.manifest().tensors_size(),
                                                   " tensors, more than the ", kMaxManifestTensors,
                                                   " a job may have"));
  }
  const auto num_groups = static_cast<int>(ParamGroupsOf(spec.config).size());
  for (const v1::TensorSpec& t : request.manifest().tensors()) {
    if (t.name().size() > kMaxTensorNameBytes || t.shape_size() > kMaxTensorRank) {
      return absl::InvalidArgumentError(absl::StrCat(
          "manifest tensor \"", t.name().substr(0, 64), t.name().size() > 64 ? "..." : "",
          "\": names are at most ", kMaxTensorNameBytes, " bytes and shapes at most ",
          kMaxTensorRank, " dimensions (this one: ", t.name().size(), " bytes, ", t.shape_size(),
          " dimensions)"));
    }
    TensorSpec spec_t{.name = t.name(), .shape = {t.shape().begin(), t.shape().end()}};
    absl::StatusOr<DType> dtype = DTypeFromProto(t.dtype());
    if (!dtype.ok() || *dtype != spec.dtype) {
      return absl::InvalidArgumentError(absl::StrCat(
          "manifest tensor \"", t.name(), "\": dtype must be the job's ",
          std::string(DTypeName(spec.dtype)), " (from the config's fp16/bf16 sections)"));
    }
    spec_t.dtype = *dtype;
    if (t.group() < 0 || t.group() >= num_groups) {
      return absl::InvalidArgumentError(
          absl::StrCat("manifest tensor \"", t.name(), "\": group ", t.group(),
                       " is not one of the config's ", num_groups, " parameter group",
                       num_groups == 1 ? "" : "s", " (zo.param_groups; none given is one group)"));
    }
    spec_t.group = t.group();
    spec.manifest.push_back(std::move(spec_t));
  }
  absl::StatusOr<ShardMap> map = ShardMap::Create(spec.manifest, spec.config.zo.chunk_elems,
                                                  static_cast<int>(spec.servers.size()));
  if (!map.ok())
    return absl::InvalidArgumentError(absl::StrCat("manifest: ", map.status().message()));
  if (map->num_chunks() > kMaxJobChunks) {
    return absl::InvalidArgumentError(
        absl::StrCat("manifest: ", map->total_elems(), " elements make ", map->num_chunks(),
                     " chunks of ", map->chunk_elems(), ", more than the ", kMaxJobChunks,
                     " a job may have: raise zo.chunk_elems"));
  }
  spec.shard_map = *std::move(map);
  return spec;
}

std::string JobSpecMismatch(const JobSpec& a, const JobSpec& b) {
  if (a.manifest.size() != b.manifest.size()) {
    return absl::StrCat("the manifest has ", b.manifest.size(), " tensors, the job's has ",
                        a.manifest.size());
  }
  for (size_t i = 0; i < a.manifest.size(); ++i) {
    const TensorSpec& x = a.manifest[i];
    const TensorSpec& y = b.manifest[i];
    if (x.name != y.name || x.shape != y.shape || x.dtype != y.dtype) {
      return absl::StrCat("manifest tensor ", i, " is \"", y.name, "\" [",
                          absl::StrJoin(y.shape, ","), "] ", std::string(DTypeName(y.dtype)),
                          ", the job's is \"", x.name, "\" [", absl::StrJoin(x.shape, ","), "] ",
                          std::string(DTypeName(x.dtype)));
    }
    if (x.group != y.group) {
      return absl::StrCat("manifest tensor \"", y.name, "\" is in parameter group ", y.group,
                          ", the job's is in group ", x.group);
    }
  }
  // Before the config: train_batch_size follows from dp_world_size, and the
  // width is what a person changed.
  if (a.dp_world_size != b.dp_world_size) {
    return absl::StrCat("dp_world_size ", b.dp_world_size, " differs from the job's ",
                        a.dp_world_size);
  }
  if (!(a.config == b.config)) return ConfigDifferences(a.config, b.config);
  if (a.servers != b.servers) {
    return absl::StrCat("server list [", absl::StrJoin(b.servers, ", "),
                        "] differs from the job's [", absl::StrJoin(a.servers, ", "), "]");
  }
  if (a.server_index != b.server_index) {
    return absl::StrCat("server_index ", b.server_index, " differs from the job's ",
                        a.server_index);
  }
  return "";
}

}  // namespace zo
