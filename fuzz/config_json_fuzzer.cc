// The DeepSpeed-style config (common/config.h): the JSON text of
// `zo-train --config` and of OpenJobRequest.config_json, parsed with the
// data-parallel widths 1 and 3 (the batch-size rule divides by it).
//
// Invariant: a config that parses comes back equal through ConfigToJson ->
// ParseConfig, which the attach rule relies on (server/job_spec.h).
#include <cstddef>
#include <cstdint>
#include <string>

#include "common/config.h"
#include "fuzz/fuzz_support.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  zo::fuzz::QuietLogs();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  for (const int dp : {1, 3}) {
    absl::StatusOr<zo::LoadedConfig> loaded = zo::ParseConfig(text, {.dp_world_size = dp});
    if (!loaded.ok()) continue;
    const std::string canonical = zo::ConfigToJson(loaded->config);
    absl::StatusOr<zo::LoadedConfig> again = zo::ParseConfig(canonical, {.dp_world_size = dp});
    ZO_FUZZ_CHECK(again.ok(), again.status().ToString() + "\n" + canonical);
    ZO_FUZZ_CHECK(again->config == loaded->config, canonical);
  }
  return 0;
}
