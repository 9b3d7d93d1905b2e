#include "offload/checkpoint/checkpoint_meta.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <optional>
#include <sstream>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/manifest_file.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"

namespace zo {
namespace {

using checkpoint_internal::CheckJobName;
using checkpoint_internal::ChecksumHex;
using checkpoint_internal::kMetaFileName;
using checkpoint_internal::ValidateMeta;

constexpr int kMetaFormatVersion = 1;

using Json = nlohmann::json;
using OrderedJson = nlohmann::ordered_json;

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
  if (meta.init_fingerprint != 0) doc["init_fingerprint"] = ChecksumHex(meta.init_fingerprint);
  if (meta.has_last_step) {
    // JSON has no NaN/Inf: null stands for a non-finite norm.
    OrderedJson norm = std::isfinite(meta.last_grad_norm) ? OrderedJson(meta.last_grad_norm)
                                                          : OrderedJson(nullptr);
    doc["last_step"] = {
        {"grad_norm", std::move(norm)}, {"lr", meta.last_lr}, {"skipped", meta.last_skipped}};
    if (!meta.last_group_lr.empty()) doc["last_step"]["group_lr"] = meta.last_group_lr;
    for (const ParamGroupConfig& g : meta.last_group_hyper) {
      doc["last_step"]["group_hyper"].push_back(
          {{"betas", {g.betas[0], g.betas[1]}}, {"eps", g.eps}, {"weight_decay", g.weight_decay}});
    }
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

// The optional sections of checkpoint.json (design.md): absent ones leave
// `meta` as it is.
absl::Status ReadInitFingerprint(const Json& doc, const std::string& file, CheckpointMeta& meta) {
  if (!doc.contains("init_fingerprint")) return absl::OkStatus();
  std::string fingerprint;
  MetaReader reader{doc, file, "", absl::OkStatus()};
  reader.Field("init_fingerprint", fingerprint);
  ZO_RETURN_IF_ERROR(reader.status);
  if (fingerprint.size() != 16 || !absl::SimpleHexAtoi(fingerprint, &meta.init_fingerprint)) {
    return absl::DataLossError(
        absl::StrCat(file, ": field \"init_fingerprint\" is not 16 hex digits"));
  }
  return absl::OkStatus();
}

absl::Status ReadLastStep(const Json& doc, const std::string& file, CheckpointMeta& meta) {
  const auto last = doc.find("last_step");
  if (last == doc.end()) return absl::OkStatus();
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
  if (const auto hyper = last->find("group_hyper"); hyper != last->end()) {
    const auto number = [](const Json& x) { return x.is_number(); };
    const auto well_formed = [&](const Json& g) {
      if (!g.is_object()) return false;
      const auto betas = g.find("betas");
      const auto eps = g.find("eps");
      const auto decay = g.find("weight_decay");
      return betas != g.end() && betas->is_array() && betas->size() == 2 &&
             std::all_of(betas->begin(), betas->end(), number) && eps != g.end() &&
             eps->is_number() && decay != g.end() && decay->is_number();
    };
    if (!hyper->is_array() || !std::all_of(hyper->begin(), hyper->end(), well_formed)) {
      return absl::DataLossError(
          absl::StrCat(file,
                       ": field \"last_step.group_hyper\" is not an array of {\"betas\": [b1, b2], "
                       "\"eps\", \"weight_decay\"}"));
    }
    for (const Json& g : *hyper) {
      meta.last_group_hyper.push_back(
          {.betas = {g["betas"][0].get<double>(), g["betas"][1].get<double>()},
           .eps = g["eps"].get<double>(),
           .weight_decay = g["weight_decay"].get<double>()});
    }
  }
  meta.has_last_step = true;
  return absl::OkStatus();
}

absl::Status ReadPrevious(const Json& doc, const std::string& file, CheckpointMeta& meta) {
  const auto previous = doc.find("previous");
  if (previous == doc.end()) return absl::OkStatus();
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
  return absl::OkStatus();
}

}  // namespace

namespace checkpoint_internal {

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

std::string MetaFileText(const CheckpointMeta& meta) { return MetaToJson(meta).dump(2) + "\n"; }

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

}  // namespace checkpoint_internal

uint32_t PreviousBytesOf(const CheckpointMeta& meta) {
  if (!meta.has_previous || meta.previous_same_data) return 0;
  const std::optional<DType> dtype = ParseDType(meta.previous_dtype);
  return dtype.has_value() ? static_cast<uint32_t>(DTypeSize(*dtype)) : 0;
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
  if (!specs.ok()) {
    return absl::Status(specs.status().code(),
                        absl::StrCat(file, ": field \"manifest\": ", specs.status().message()));
  }
  meta.manifest = *std::move(specs);
  ZO_RETURN_IF_ERROR(ReadInitFingerprint(doc, file, meta));
  ZO_RETURN_IF_ERROR(ReadLastStep(doc, file, meta));
  ZO_RETURN_IF_ERROR(ReadPrevious(doc, file, meta));
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

}  // namespace zo
