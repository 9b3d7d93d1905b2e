// `zo-ctl export` (ctl/safetensors_export.h): a checkpoint.json fed as in
// checkpoint_meta_fuzzer.cc, beside the reference parts, exported to
// safetensors through a small buffer.
//
// Invariant: an export that succeeds is a well-formed safetensors file:
// the header length, a JSON header naming every manifest tensor once
// (shape, F32, contiguous data offsets in manifest order) and __metadata__,
// and the reference master weights as the data.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "ctl/safetensors_export.h"
#include "fuzz/fuzz_support.h"
#include "nlohmann/json.hpp"
#include "offload/checkpoint/checkpoint_dir.h"

namespace {

const zo::testing::FlatState* reference = nullptr;
std::string* dir = nullptr;
std::string* out = nullptr;

void CheckExport(const zo::CheckpointMeta& meta, const std::string& file) {
  ZO_FUZZ_CHECK(file.size() >= 8, "no header length");
  uint64_t n;
  std::memcpy(&n, file.data(), 8);
  ZO_FUZZ_CHECK(n % 8 == 0 && n <= file.size() - 8, "header length");
  const nlohmann::json header =
      nlohmann::json::parse(file.substr(8, n), nullptr, /*allow_exceptions=*/false);
  ZO_FUZZ_CHECK(header.is_object(), "the header is not a JSON object");
  ZO_FUZZ_CHECK(header.size() == meta.manifest.size() + 1, "not one entry per tensor");
  ZO_FUZZ_CHECK(header.contains("__metadata__"), "no __metadata__");
  const std::string body = file.substr(8 + n);
  uint64_t at = 0;
  for (const zo::TensorSpec& t : meta.manifest) {
    ZO_FUZZ_CHECK(header.contains(t.name), t.name);
    const nlohmann::json& e = header[t.name];
    ZO_FUZZ_CHECK(e["dtype"] == "F32", t.name);
    ZO_FUZZ_CHECK(e["shape"].get<std::vector<int64_t>>() == t.shape, t.name);
    const auto offsets = e["data_offsets"].get<std::vector<uint64_t>>();
    ZO_FUZZ_CHECK(offsets.size() == 2 && offsets[0] == at && offsets[1] >= at, t.name);
    at = offsets[1];
  }
  ZO_FUZZ_CHECK(at == body.size(), "data size");
  ZO_FUZZ_CHECK(body.size() <= reference->master.size() * sizeof(float), "more data than state");
  ZO_FUZZ_CHECK(std::memcmp(body.data(), reference->master.data(), body.size()) == 0,
                "data differs from the master weights");
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  zo::fuzz::QuietLogs();
  reference = new zo::testing::FlatState(zo::fuzz::ReferenceState());
  dir = new std::string(zo::fuzz::ScratchDir() + "/ckpt");
  std::filesystem::create_directories(*dir);
  out = new std::string(zo::fuzz::ScratchDir() + "/out.safetensors");
  zo::fuzz::WriteReferenceParts(*dir);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  zo::fuzz::WriteFileOrDie(*dir + "/checkpoint.json", {reinterpret_cast<const char*>(data), size});
  absl::StatusOr<zo::CheckpointMeta> meta = zo::ReadCheckpointMeta(*dir);
  if (!meta.ok()) return 0;
  std::filesystem::remove(*out);
  absl::StatusOr<zo::SafetensorsExportSummary> summary =
      zo::ExportMasterToSafetensors(*dir, *out, {.buffer_elems = 11});
  if (!summary.ok()) {
    ZO_FUZZ_CHECK(!std::filesystem::exists(*out), "a failed export left its file");
    return 0;
  }
  CheckExport(*meta, zo::fuzz::ReadFileOrDie(*out));
  return 0;
}
