// A model manifest file (common/manifest_file.h), as `zo-ctl estimate
// --manifest` reads it: ParseManifestJson, then what the estimate does with
// the tensors (ctl/estimate_command.cc: element counts, EstimateMemory and
// both formats, in RAM and on NVMe) and what a server does with a manifest
// (ShardMap::Create, every tensor's pieces).
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/manifest_file.h"
#include "common/memory_estimate.h"
#include "common/sharding.h"
#include "fuzz/fuzz_support.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  zo::fuzz::QuietLogs();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<std::vector<zo::TensorSpec>> specs = zo::ParseManifestJson(text);
  if (!specs.ok()) return 0;

  absl::StatusOr<zo::ShardMap> map = zo::ShardMap::Create(*specs, /*chunk_elems=*/64, 3);
  if (map.ok()) {
    // Bounded: a piece per chunk a tensor touches.
    if (map->num_chunks() <= 4096) {
      for (int t = 0; t < static_cast<int>(map->tensors().size()); ++t) {
        int64_t covered = 0;
        for (const zo::TensorPiece& p : map->PiecesOfTensor(t)) covered += p.length;
        ZO_FUZZ_CHECK(covered == map->TensorRange(t).size(), specs->at(t).name);
      }
    }
  }

  zo::EstimateInput in;
  for (const zo::TensorSpec& t : *specs) in.tensor_elems.push_back(zo::NumElements(t.shape));
  if (in.tensor_elems.empty()) return 0;
  in.pipeline_stages = 2;
  in.servers = 3;
  for (const bool nvme : {false, true}) {
    in.nvme = nvme;
    absl::StatusOr<zo::MemoryEstimate> estimate = zo::EstimateMemory(in);
    if (!estimate.ok()) continue;
    zo::FormatEstimateTable(*estimate);
    zo::FormatEstimateJson(*estimate);
  }
  return 0;
}
