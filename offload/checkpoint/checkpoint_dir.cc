#include "offload/checkpoint/checkpoint_dir.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <optional>
#include <sstream>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/manifest_file.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"
#include "offload/checkpoint/durable_file.h"
#include "offload/io/io_error.h"

namespace zo {
namespace {

constexpr char kMetaFileName[] = "checkpoint.json";
constexpr char kTmpSuffix[] = ".tmp";
constexpr int kMetaFormatVersion = 1;

using Json = nlohmann::json;
using OrderedJson = nlohmann::ordered_json;

// Job names as the protocol allows them (job.proto): [A-Za-z0-9._-]{1,128},
// which also keeps them a single path component.
absl::Status CheckJobName(const std::string& job) {
  const bool chars_ok = std::all_of(job.begin(), job.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
           c == '_' || c == '-';
  });
  if (job.empty() || job.size() > 128 || !chars_ok || job == "." || job == "..") {
    return absl::InvalidArgumentError(absl::StrCat(
        "job name '", job, "' must be 1 to 128 characters of [A-Za-z0-9._-], not . or .."));
  }
  return absl::OkStatus();
}

std::string ChecksumHex(uint64_t v) { return absl::StrCat(absl::Hex(v, absl::kZeroPad16)); }

std::string BaseName(std::string path) {
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  const size_t slash = path.find_last_of('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

// The version in a committed directory's name ("step-00000020" -> 20).
std::optional<int64_t> VersionOfDirName(const std::string& name) {
  if (!absl::StartsWith(name, "step-")) return std::nullopt;
  const std::string digits = name.substr(5);
  if (digits.empty() || !std::all_of(digits.begin(), digits.end(), absl::ascii_isdigit)) {
    return std::nullopt;
  }
  int64_t v = 0;
  if (!absl::SimpleAtoi(digits, &v)) return std::nullopt;
  return v;
}

// One schema drives both directions of checkpoint.json's scalar fields, so
// writing and reading cannot drift apart.
template <typename V, typename Meta>  // Meta: CheckpointMeta, const or not
void VisitMeta(V& v, Meta& m) {
  v.Field("format_version", m.format_version);
  v.Field("job", m.job);
  v.Field("version", m.version);
  v.Field("applied_steps", m.applied_steps);
  v.Field("loss_scale", m.loss_scale);
  v.Field("scaler_iteration", m.scaler_iteration);
  v.Field("scaler_last_overflow_iteration", m.scaler_last_overflow_iteration);
  v.Field("scaler_hysteresis_left", m.scaler_hysteresis_left);
  v.Field("chunk_elems", m.chunk_elems);
  v.Field("num_servers", m.num_servers);
  v.Field("dp_world_size", m.dp_world_size);
  v.Field("config_json", m.config_json);
}

struct MetaWriter {
  OrderedJson& doc;
  template <typename T>
  void Field(const char* key, const T& value) {
    doc[key] = value;
  }
};

// Reads fields of the object `doc`; the first problem is kept in `status`,
// naming the file and the field ("parts[1].bytes").
struct MetaReader {
  const Json& doc;
  const std::string& file;
  std::string prefix;  // "" or "parts[1]."
  absl::Status status;

  const Json* Get(const char* key, bool ok_type(const Json&), const char* want) {
    if (!status.ok()) return nullptr;
    const auto it = doc.find(key);
    if (it == doc.end()) {
      status = absl::DataLossError(absl::StrCat(file, ": field \"", prefix, key, "\" is missing"));
      return nullptr;
    }
    if (!ok_type(*it)) {
      status = absl::DataLossError(
          absl::StrCat(file, ": field \"", prefix, key, "\" = ", it->dump(), " is not ", want));
      return nullptr;
    }
    return &*it;
  }
  void Field(const char* key, int64_t& value) {
    const Json* j = Get(
        key, [](const Json& x) { return x.is_number_integer(); }, "an integer");
    if (j != nullptr) value = j->get<int64_t>();
  }
  void Field(const char* key, int& value) {
    int64_t wide = 0;
    Field(key, wide);
    if (!status.ok()) return;
    if (wide < std::numeric_limits<int>::min() || wide > std::numeric_limits<int>::max()) {
      status = absl::InvalidArgumentError(
          absl::StrCat(file, ": field \"", prefix, key, "\" = ", wide, " is out of range"));
      return;
    }
    value = static_cast<int>(wide);
  }
  void Field(const char* key, double& value) {
    const Json* j = Get(
        key, [](const Json& x) { return x.is_number(); }, "a number");
    if (j != nullptr) value = j->get<double>();
  }
  void Field(const char* key, std::string& value) {
    const Json* j = Get(
        key, [](const Json& x) { return x.is_string(); }, "a string");
    if (j != nullptr) value = j->get<std::string>();
  }
  void Field(const char* key, bool& value) {
    const Json* j = Get(
        key, [](const Json& x) { return x.is_boolean(); }, "a boolean");
    if (j != nullptr) value = j->get<bool>();
  }
};

OrderedJson MetaToJson(const CheckpointMeta& meta) {
  OrderedJson doc = OrderedJson::object();
  MetaWriter writer{doc};
  VisitMeta(writer, meta);
  // The manifest is a manifest file's document ({"tensors": [...]}).
  OrderedJson tensors = OrderedJson::array();
  for (const TensorSpec& t : meta.manifest) {
    tensors.push_back({{"name", t.name}, {"shape", t.shape}, {"dtype", DTypeName(t.dtype)}});
    if (t.group != 0) tensors.back()["group"] = t.group;
  }
  doc["manifest"] = {{"tensors", std::move(tensors)}};
  if (meta.has_last_step) {
    // JSON has no NaN/Inf: null stands for a non-finite norm.
    OrderedJson norm = std::isfinite(meta.last_grad_norm) ? OrderedJson(meta.last_grad_norm)
                                                          : OrderedJson(nullptr);
    doc["last_step"] = {
        {"grad_norm", std::move(norm)}, {"lr", meta.last_lr}, {"skipped", meta.last_skipped}};
    if (!meta.last_group_lr.empty()) doc["last_step"]["group_lr"] = meta.last_group_lr;
  }
  if (meta.has_previous) {
    doc["previous"] = {{"version", meta.previous_version},
                       {"loss_scale", meta.previous_loss_scale},
                       {"dtype", meta.previous_dtype},
                       {"same_data", meta.previous_same_data}};
  }
  OrderedJson parts = OrderedJson::array();
  for (const CheckpointPartSummary& p : meta.parts) {
    parts.push_back(
        {{"file", p.file}, {"bytes", p.bytes}, {"index_checksum", ChecksumHex(p.index_checksum)}});
  }
  doc["parts"] = std::move(parts);
  return doc;
}

// The part file names and counts of `meta`, and the shard map they imply.
// INVALID_ARGUMENT naming `where` and the field.
absl::StatusOr<ShardMap> ValidateMeta(const CheckpointMeta& meta, const std::string& where) {
  auto bad = [&](const std::string& what) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": ", what));
  };
  if (meta.format_version != kMetaFormatVersion) {
    return bad(absl::StrCat("format_version ", meta.format_version, " is not ", kMetaFormatVersion,
                            ", the one this build reads"));
  }
  if (absl::Status s = CheckJobName(meta.job); !s.ok())
    return bad(absl::StrCat("job: ", s.message()));
  if (meta.version < 0 || meta.applied_steps < 0 || meta.applied_steps > meta.version) {
    return bad(absl::StrCat("version ", meta.version, " and applied_steps ", meta.applied_steps,
                            " must satisfy 0 <= applied_steps <= version"));
  }
  if (meta.dp_world_size < 1)
    return bad(absl::StrCat("dp_world_size ", meta.dp_world_size, " must be >= 1"));
  if (meta.num_servers < 1 || meta.parts.size() != static_cast<size_t>(meta.num_servers)) {
    return bad(absl::StrCat("num_servers ", meta.num_servers, " must be >= 1 and match the ",
                            meta.parts.size(), " parts listed"));
  }
  for (size_t i = 0; i < meta.parts.size(); ++i) {
    const std::string& f = meta.parts[i].file;
    if (f.empty() || f.find('/') != std::string::npos || f == "." || f == ".." ||
        meta.parts[i].bytes <= 0) {
      return bad(absl::StrCat("parts[", i, "]: file '", f, "' (", meta.parts[i].bytes,
                              " bytes) must be a non-empty file name inside the directory"));
    }
  }
  if (meta.has_previous) {
    if (meta.previous_version != meta.version - 1 || meta.version < 1) {
      return bad(absl::StrCat("previous.version ", meta.previous_version,
                              " must be the one before version ", meta.version));
    }
    if (!ParseDType(meta.previous_dtype).has_value()) {
      return bad(absl::StrCat("previous.dtype '", meta.previous_dtype, "' is not a known type"));
    }
    if (!std::isfinite(meta.previous_loss_scale) || meta.previous_loss_scale <= 0) {
      return bad(absl::StrCat("previous.loss_scale ", meta.previous_loss_scale,
                              " must be finite and > 0"));
    }
  }
  absl::StatusOr<ShardMap> map =
      ShardMap::Create(meta.manifest, meta.chunk_elems, meta.num_servers);
  if (!map.ok()) return bad(absl::StrCat("manifest/chunk_elems: ", map.status().message()));
  return map;
}

// A part holds exactly the chunks of its server, with their flat ranges.
absl::Status CheckPartChunks(const CheckpointPartReader& part, const ShardMap& map, int server,
                             const std::string& path) {
  std::vector<CheckpointChunk> want;
  for (int64_t c : map.ChunksOfServer(server)) {
    const FlatRange r = map.ChunkRange(c);
    want.push_back(CheckpointChunk{c, r.begin, r.size()});
  }
  if (part.chunks() == want) return absl::OkStatus();
  auto describe = [](const std::vector<CheckpointChunk>& cs) {
    std::string s = absl::StrCat(cs.size(), " chunks");
    for (size_t i = 0; i < cs.size() && i < 4; ++i) {
      absl::StrAppend(&s, i == 0 ? ": " : ", ", cs[i].chunk, "@", cs[i].flat_begin, "+",
                      cs[i].elems);
    }
    if (cs.size() > 4) absl::StrAppend(&s, ", ...");
    return s;
  };
  return absl::DataLossError(absl::StrCat("checkpoint part ", path, " of server ", server,
                                          " holds ", describe(part.chunks()),
                                          "; the manifest "
                                          "puts ",
                                          describe(want), " there"));
}

// Opens part `server` of the checkpoint in `dir` and checks it against the meta.
absl::StatusOr<std::unique_ptr<CheckpointPartReader>> OpenPart(const std::string& dir,
                                                               const CheckpointMeta& meta,
                                                               const ShardMap& map, int server) {
  const CheckpointPartSummary& want = meta.parts[static_cast<size_t>(server)];
  const std::string path = absl::StrCat(dir, "/", want.file);
  ZO_ASSIGN_OR_RETURN(std::unique_ptr<CheckpointPartReader> part, CheckpointPartReader::Open(path));
  const CheckpointPartSummary& got = part->summary();
  if (got != want) {
    return absl::DataLossError(
        absl::StrCat("checkpoint part ", path, " is ", got.bytes, " bytes with index checksum ",
                     ChecksumHex(got.index_checksum), "; ", kMetaFileName, " lists ", want.bytes,
                     " bytes and ", ChecksumHex(want.index_checksum)));
  }
  ZO_RETURN_IF_ERROR(CheckPartChunks(*part, map, server, path));
  if (part->previous_bytes() != PreviousBytesOf(meta)) {
    return absl::DataLossError(absl::StrCat("checkpoint part ", path, " holds ",
                                            part->previous_bytes(),
                                            " bytes per element of the previous version; ",
                                            kMetaFileName, " says ", PreviousBytesOf(meta)));
  }
  return part;
}

absl::Status WithContext(const absl::Status& s, const std::string& context) {
  return absl::Status(s.code(), absl::StrCat(context, ": ", s.message()));
}

}  // namespace

std::string CheckpointDirName(int64_t version) { return absl::StrFormat("step-%08d", version); }

std::string CheckpointPartFileName(int server_index) {
  return absl::StrFormat("part-%05d.zop", server_index);
}

uint32_t PreviousBytesOf(const CheckpointMeta& meta) {
  if (!meta.has_previous || meta.previous_same_data) return 0;
  const std::optional<DType> dtype = ParseDType(meta.previous_dtype);
  return dtype.has_value() ? static_cast<uint32_t>(DTypeSize(*dtype)) : 0;
}

absl::StatusOr<std::string> BeginCheckpoint(const std::string& root, const std::string& job,
                                            int64_t version) {
  ZO_RETURN_IF_ERROR(CheckJobName(job));
  if (version < 0) {
    return absl::InvalidArgumentError(absl::StrCat("checkpoint version ", version, " is < 0"));
  }
  const std::string job_dir = absl::StrCat(root, "/", job);
  std::error_code ec;
  const bool made = std::filesystem::create_directories(job_dir, ec);
  if (ec) return ZO_ERRNO_STATUS(ec.value(), absl::StrCat("create checkpoint directory ", job_dir));
  if (made) ZO_RETURN_IF_ERROR(SyncPath(root));
  const std::string final_dir = absl::StrCat(job_dir, "/", CheckpointDirName(version));
  if (std::filesystem::exists(final_dir, ec)) {
    return absl::AlreadyExistsError(absl::StrCat("checkpoint of job ", job, " at version ", version,
                                                 " already exists: ", final_dir));
  }
  const std::string tmp = final_dir + kTmpSuffix;
  // Stale attempts, this version's and others'.
  std::vector<std::filesystem::path> stale;
  for (const auto& entry : std::filesystem::directory_iterator(job_dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (absl::StartsWith(name, "step-") && absl::EndsWith(name, kTmpSuffix)) {
      stale.push_back(entry.path());
    }
  }
  if (ec) return ZO_ERRNO_STATUS(ec.value(), absl::StrCat("list ", job_dir));
  for (const std::filesystem::path& p : stale) {
    std::filesystem::remove_all(p, ec);
    if (ec) return ZO_ERRNO_STATUS(ec.value(), absl::StrCat("remove stale ", p.string()));
  }
  if (mkdir(tmp.c_str(), 0755) != 0) return ZO_ERRNO_STATUS(errno, absl::StrCat("mkdir ", tmp));
  return tmp;
}

absl::Status AbandonCheckpoint(const std::string& tmp_dir) {
  if (!absl::EndsWith(tmp_dir, kTmpSuffix)) {
    return absl::InvalidArgumentError(
        absl::StrCat("not a temporary checkpoint directory: ", tmp_dir));
  }
  std::error_code ec;
  std::filesystem::remove_all(tmp_dir, ec);
  if (ec) return ZO_ERRNO_STATUS(ec.value(), absl::StrCat("remove ", tmp_dir));
  return absl::OkStatus();
}

absl::StatusOr<std::string> CommitCheckpoint(const std::string& tmp_dir,
                                             const CheckpointMeta& meta) {
  const std::string context = absl::StrCat("cannot commit checkpoint ", tmp_dir);
  std::string dir = tmp_dir;
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  const std::string want_name = CheckpointDirName(meta.version) + kTmpSuffix;
  if (BaseName(dir) != want_name || BaseName(DirectoryOf(dir)) != meta.job) {
    return absl::InvalidArgumentError(absl::StrCat(context, ": the directory of job ", meta.job,
                                                   " at version ", meta.version, " must be <root>/",
                                                   meta.job, "/", want_name));
  }
  absl::StatusOr<ShardMap> map = ValidateMeta(meta, context);
  if (!map.ok()) return map.status();
  for (int i = 0; i < meta.num_servers; ++i) {
    absl::StatusOr<std::unique_ptr<CheckpointPartReader>> part = OpenPart(dir, meta, *map, i);
    if (!part.ok())
      return WithContext(part.status(), absl::StrCat(context, ": part of server ", i));
  }
  {
    absl::StatusOr<std::unique_ptr<AtomicFileWriter>> out =
        AtomicFileWriter::Create(absl::StrCat(dir, "/", kMetaFileName));
    if (!out.ok()) return WithContext(out.status(), context);
    absl::Status s = (*out)->Append(MetaToJson(meta).dump(2) + "\n");
    if (s.ok()) s = (*out)->Commit();  // fsyncs the directory: parts and record are durable
    if (!s.ok()) return WithContext(s, context);
  }
  const std::string final_dir = dir.substr(0, dir.size() - (sizeof(kTmpSuffix) - 1));
  if (renameat2(AT_FDCWD, dir.c_str(), AT_FDCWD, final_dir.c_str(), RENAME_NOREPLACE) != 0) {
    const int err = errno;
    if (err == EEXIST || err == ENOTEMPTY) {
      return absl::AlreadyExistsError(
          absl::StrCat(context, ": ", final_dir, " already exists (committed before?)"));
    }
    return ZO_ERRNO_STATUS(err, absl::StrCat(context, ": rename to ", final_dir));
  }
  ZO_RETURN_IF_ERROR(SyncPath(DirectoryOf(final_dir)));
  return final_dir;
}

absl::StatusOr<std::string> LatestCheckpoint(const std::string& root, const std::string& job) {
  ZO_RETURN_IF_ERROR(CheckJobName(job));
  const std::string job_dir = absl::StrCat(root, "/", job);
  std::vector<std::pair<int64_t, std::string>> found;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(job_dir, ec)) {
    const std::string name = entry.path().filename().string();
    const std::optional<int64_t> v = VersionOfDirName(name);  // rejects *.tmp
    if (v && entry.is_directory(ec)) found.emplace_back(*v, entry.path().string());
  }
  std::sort(found.begin(), found.end(), std::greater<>());
  for (const auto& [version, path] : found) {
    absl::StatusOr<CheckpointMeta> meta = ReadCheckpointMeta(path);
    if (meta.ok() && meta->version == version && meta->job == job) return path;
  }
  return absl::NotFoundError(absl::StrCat("no committed checkpoint of job ", job, " in ", job_dir));
}

absl::StatusOr<std::vector<std::string>> PruneCheckpoints(const std::string& root,
                                                          const std::string& job, int keep) {
  ZO_RETURN_IF_ERROR(CheckJobName(job));
  if (keep < 1) return absl::InvalidArgumentError(absl::StrCat("keep ", keep, " checkpoints?"));
  const std::string job_dir = absl::StrCat(root, "/", job);
  std::vector<std::pair<int64_t, std::string>> committed;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(job_dir, ec)) {
    const std::optional<int64_t> v = VersionOfDirName(entry.path().filename().string());
    if (v && entry.is_directory(ec)) committed.emplace_back(*v, entry.path().string());
  }
  if (ec) return absl::InternalError(absl::StrCat("cannot list ", job_dir, ": ", ec.message()));
  std::sort(committed.begin(), committed.end(), std::greater<>());
  std::vector<std::string> removed;
  for (size_t i = static_cast<size_t>(keep); i < committed.size(); ++i) {
    std::filesystem::remove_all(committed[i].second, ec);
    if (ec) {
      return absl::InternalError(
          absl::StrCat("cannot remove ", committed[i].second, ": ", ec.message()));
    }
    removed.push_back(committed[i].second);
  }
  return removed;
}

absl::StatusOr<std::vector<std::string>> RemoveJobCheckpoints(const std::string& root,
                                                              const std::string& job) {
  ZO_RETURN_IF_ERROR(CheckJobName(job));
  const std::string job_dir = absl::StrCat(root, "/", job);
  std::vector<std::string> removed;
  std::error_code ec;
  if (!std::filesystem::exists(job_dir, ec)) return removed;
  for (const auto& entry : std::filesystem::directory_iterator(job_dir, ec)) {
    if (entry.is_directory(ec)) removed.push_back(entry.path().string());
  }
  if (ec) return absl::InternalError(absl::StrCat("cannot list ", job_dir, ": ", ec.message()));
  std::sort(removed.begin(), removed.end());
  std::filesystem::remove_all(job_dir, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot remove ", job_dir, ": ", ec.message()));
  return removed;
}

absl::StatusOr<CheckpointMeta> ReadCheckpointMeta(const std::string& dir) {
  const std::string file = absl::StrCat(dir, "/", kMetaFileName);
  std::ifstream in(file);
  if (!in) {
    return absl::NotFoundError(absl::StrCat("cannot open ", file, ": not a committed checkpoint"));
  }
  std::stringstream text;
  text << in.rdbuf();
  const Json doc = Json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded() || !doc.is_object()) {
    return absl::DataLossError(absl::StrCat(file, " is not a JSON object"));
  }
  CheckpointMeta meta;
  MetaReader reader{doc, file, "", absl::OkStatus()};
  VisitMeta(reader, meta);
  ZO_RETURN_IF_ERROR(reader.status);
  const auto manifest = doc.find("manifest");
  if (manifest == doc.end() || !manifest->is_object()) {
    return absl::DataLossError(
        absl::StrCat(file, ": field \"manifest\" is missing or not an object"));
  }
  absl::StatusOr<std::vector<TensorSpec>> specs = ParseManifestJson(manifest->dump());
  if (!specs.ok()) return WithContext(specs.status(), absl::StrCat(file, ": field \"manifest\""));
  meta.manifest = *std::move(specs);
  if (const auto last = doc.find("last_step"); last != doc.end()) {
    if (!last->is_object()) {
      return absl::DataLossError(absl::StrCat(file, ": field \"last_step\" is not an object"));
    }
    MetaReader lr{*last, file, "last_step.", absl::OkStatus()};
    const auto norm = last->find("grad_norm");
    if (norm != last->end() && norm->is_null()) {
      meta.last_grad_norm = std::numeric_limits<double>::quiet_NaN();
    } else {
      lr.Field("grad_norm", meta.last_grad_norm);
    }
    lr.Field("lr", meta.last_lr);
    lr.Field("skipped", meta.last_skipped);
    ZO_RETURN_IF_ERROR(lr.status);
    if (const auto group_lr = last->find("group_lr"); group_lr != last->end()) {
      if (!group_lr->is_array() || !std::all_of(group_lr->begin(), group_lr->end(),
                                                [](const auto& x) { return x.is_number(); })) {
        return absl::DataLossError(
            absl::StrCat(file, ": field \"last_step.group_lr\" is not an array of numbers"));
      }
      meta.last_group_lr = group_lr->get<std::vector<double>>();
    }
    meta.has_last_step = true;
  }
  if (const auto previous = doc.find("previous"); previous != doc.end()) {
    if (!previous->is_object()) {
      return absl::DataLossError(absl::StrCat(file, ": field \"previous\" is not an object"));
    }
    MetaReader pr{*previous, file, "previous.", absl::OkStatus()};
    pr.Field("version", meta.previous_version);
    pr.Field("loss_scale", meta.previous_loss_scale);
    pr.Field("dtype", meta.previous_dtype);
    pr.Field("same_data", meta.previous_same_data);
    ZO_RETURN_IF_ERROR(pr.status);
    meta.has_previous = true;
  }
  const auto parts = doc.find("parts");
  if (parts == doc.end() || !parts->is_array()) {
    return absl::DataLossError(absl::StrCat(file, ": field \"parts\" is missing or not an array"));
  }
  for (size_t i = 0; i < parts->size(); ++i) {
    const Json& p = (*parts)[i];
    if (!p.is_object()) {
      return absl::DataLossError(absl::StrCat(file, ": parts[", i, "] is not an object"));
    }
    CheckpointPartSummary part;
    std::string sum;
    MetaReader pr{p, file, absl::StrCat("parts[", i, "]."), absl::OkStatus()};
    pr.Field("file", part.file);
    pr.Field("bytes", part.bytes);
    pr.Field("index_checksum", sum);
    ZO_RETURN_IF_ERROR(pr.status);
    if (sum.size() != 16 || !absl::SimpleHexAtoi(sum, &part.index_checksum)) {
      return absl::DataLossError(
          absl::StrCat(file, ": parts[", i, "].index_checksum '", sum, "' is not 16 hex digits"));
    }
    meta.parts.push_back(std::move(part));
  }
  absl::StatusOr<ShardMap> map = ValidateMeta(meta, file);
  if (!map.ok()) return map.status();
  return meta;
}

// ------------------------------------------------------ CheckpointReader ---

struct CheckpointReader::Impl {
  std::string dir;
  CheckpointMeta meta;
  std::optional<ShardMap> map;
  std::vector<std::unique_ptr<CheckpointPartReader>> parts;  // null until first used

  absl::StatusOr<const CheckpointPartReader*> Part(int server) {
    std::unique_ptr<CheckpointPartReader>& part = parts[static_cast<size_t>(server)];
    if (part == nullptr) {
      ZO_ASSIGN_OR_RETURN(part, OpenPart(dir, meta, *map, server));
    }
    return part.get();
  }
};

absl::StatusOr<std::unique_ptr<CheckpointReader>> CheckpointReader::Open(const std::string& dir) {
  ZO_ASSIGN_OR_RETURN(CheckpointMeta meta, ReadCheckpointMeta(dir));
  ZO_ASSIGN_OR_RETURN(ShardMap map,
                      ShardMap::Create(meta.manifest, meta.chunk_elems, meta.num_servers));
  auto impl = std::make_unique<Impl>();
  impl->dir = dir;
  impl->parts.resize(static_cast<size_t>(meta.num_servers));
  impl->meta = std::move(meta);
  impl->map.emplace(std::move(map));
  return std::unique_ptr<CheckpointReader>(new CheckpointReader(std::move(impl)));
}

CheckpointReader::CheckpointReader(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CheckpointReader::~CheckpointReader() = default;

const CheckpointMeta& CheckpointReader::meta() const { return impl_->meta; }
int64_t CheckpointReader::total_elems() const { return impl_->map->total_elems(); }

absl::Status CheckpointReader::ReadFlat(int64_t flat_begin, absl::Span<float> master,
                                        absl::Span<float> m, absl::Span<float> v) {
  const ShardMap& map = *impl_->map;
  const size_t n = std::max({master.size(), m.size(), v.size()});
  for (const absl::Span<float>* out : {&master, &m, &v}) {
    if (!out->empty() && out->size() != n) {
      return absl::InvalidArgumentError(absl::StrCat(
          "checkpoint ", impl_->dir, ": ReadFlat got spans of ", master.size(), ", ", m.size(),
          " and ", v.size(), " elements; each must be empty or of one size"));
    }
  }
  const int64_t total = map.total_elems();
  if (flat_begin < 0 || flat_begin > total || static_cast<int64_t>(n) > total - flat_begin) {
    return absl::OutOfRangeError(absl::StrCat("checkpoint ", impl_->dir, ": elements [", flat_begin,
                                              ", ", flat_begin + static_cast<int64_t>(n),
                                              ") are outside the job's ", total, " elements"));
  }
  auto piece = [](absl::Span<float> out, size_t pos, size_t len) {
    return out.empty() ? out : out.subspan(pos, len);
  };
  for (size_t done = 0; done < n;) {
    const int64_t pos = flat_begin + static_cast<int64_t>(done);
    const int64_t chunk = pos / map.chunk_elems();
    const FlatRange range = map.ChunkRange(chunk);
    const size_t len =
        static_cast<size_t>(std::min<int64_t>(range.end - pos, static_cast<int64_t>(n - done)));
    ZO_ASSIGN_OR_RETURN(const CheckpointPartReader* part, impl_->Part(map.ServerOfChunk(chunk)));
    ZO_RETURN_IF_ERROR(part->Read(chunk, pos - range.begin, piece(master, done, len),
                                  piece(m, done, len), piece(v, done, len)));
    done += len;
  }
  return absl::OkStatus();
}

absl::Status CheckpointReader::ReadPreviousFlat(int64_t flat_begin, int64_t n, void* out) {
  const ShardMap& map = *impl_->map;
  const uint32_t size = PreviousBytesOf(impl_->meta);
  if (size == 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("checkpoint ", impl_->dir, " holds no previous version's weights"));
  }
  const int64_t total = map.total_elems();
  if (flat_begin < 0 || n < 0 || flat_begin > total || n > total - flat_begin) {
    return absl::OutOfRangeError(absl::StrCat("checkpoint ", impl_->dir, ": elements [", flat_begin,
                                              ", ", flat_begin + n, ") are outside the job's ",
                                              total, " elements"));
  }
  char* dst = static_cast<char*>(out);
  for (int64_t done = 0; done < n;) {
    const int64_t pos = flat_begin + done;
    const int64_t chunk = pos / map.chunk_elems();
    const FlatRange range = map.ChunkRange(chunk);
    const int64_t len = std::min(range.end - pos, n - done);
    ZO_ASSIGN_OR_RETURN(const CheckpointPartReader* part, impl_->Part(map.ServerOfChunk(chunk)));
    ZO_RETURN_IF_ERROR(part->ReadPrevious(chunk, pos - range.begin, len, dst + done * size));
    done += len;
  }
  return absl::OkStatus();
}

}  // namespace zo
