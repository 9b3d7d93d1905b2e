#include "ctl/safetensors_export.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/sharding.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"
#include "offload/checkpoint/checkpoint_dir.h"
#include "offload/checkpoint/durable_file.h"

namespace zo {
namespace {

// safetensors stores little-endian data; so does the checkpoint, and the
// floats go from one to the other as they are.
static_assert(std::endian::native == std::endian::little);

constexpr char kMetadataKey[] = "__metadata__";

// The header, padded with spaces to a multiple of 8, behind its length.
std::string HeaderBytes(const nlohmann::ordered_json& header) {
  std::string json = header.dump();
  json.append((8 - json.size() % 8) % 8, ' ');
  const uint64_t n = json.size();
  char len[8];
  std::memcpy(len, &n, sizeof(len));
  return std::string(len, sizeof(len)) + json;
}

}  // namespace

absl::Status ExportMasterToSafetensors(const std::string& checkpoint_dir,
                                       const std::string& out_path) {
  return ExportMasterToSafetensors(checkpoint_dir, out_path, SafetensorsExportOptions()).status();
}

absl::StatusOr<SafetensorsExportSummary> ExportMasterToSafetensors(
    const std::string& checkpoint_dir, const std::string& out_path,
    const SafetensorsExportOptions& options) {
  if (options.buffer_elems < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("export buffer of ", options.buffer_elems, " elements must be >= 1"));
  }
  ZO_ASSIGN_OR_RETURN(std::unique_ptr<CheckpointReader> reader,
                      CheckpointReader::Open(checkpoint_dir));
  const CheckpointMeta& meta = reader->meta();

  // Tensors in manifest order are the flat space in order, so a tensor's
  // data offsets are its flat range in bytes.
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  std::vector<FlatRange> ranges;
  int64_t flat = 0;
  for (const TensorSpec& t : meta.manifest) {
    if (t.name == kMetadataKey) {
      return absl::InvalidArgumentError(
          absl::StrCat("checkpoint ", checkpoint_dir, ": a tensor named ", kMetadataKey,
                       " cannot be written to safetensors, whose header reserves the name"));
    }
    const FlatRange r{flat, flat + NumElements(t.shape)};
    header[t.name] = {
        {"dtype", "F32"}, {"shape", t.shape}, {"data_offsets", {r.begin * 4, r.end * 4}}};
    ranges.push_back(r);
    flat = r.end;
  }
  header[kMetadataKey] = {{"format", "pt"},
                          {"zo_job", meta.job},
                          {"zo_version", absl::StrCat(meta.version)},
                          {"zo_step", absl::StrCat(meta.applied_steps)}};

  ZO_ASSIGN_OR_RETURN(std::unique_ptr<AtomicFileWriter> out, AtomicFileWriter::Create(out_path));
  ZO_RETURN_IF_ERROR(out->Append(HeaderBytes(header)));
  std::vector<float> buffer(static_cast<size_t>(
      std::max<int64_t>(1, std::min(options.buffer_elems, reader->total_elems()))));
  for (size_t t = 0; t < ranges.size(); ++t) {
    for (int64_t pos = ranges[t].begin; pos < ranges[t].end;) {
      const size_t n = static_cast<size_t>(
          std::min<int64_t>(ranges[t].end - pos, static_cast<int64_t>(buffer.size())));
      const absl::Span<float> piece(buffer.data(), n);
      absl::Status read = reader->ReadFlat(pos, piece, {}, {});
      if (!read.ok()) {
        return absl::Status(read.code(), absl::StrCat("export of tensor '", meta.manifest[t].name,
                                                      "' to ", out_path, ": ", read.message()));
      }
      ZO_RETURN_IF_ERROR(out->Append(
          absl::string_view(reinterpret_cast<const char*>(piece.data()), n * sizeof(float))));
      pos += static_cast<int64_t>(n);
    }
    if (options.progress) options.progress(static_cast<int64_t>(t), meta.manifest[t].name);
  }
  ZO_RETURN_IF_ERROR(out->Commit());
  return SafetensorsExportSummary{static_cast<int64_t>(ranges.size()),
                                  static_cast<int64_t>(out->bytes_written())};
}

}  // namespace zo
