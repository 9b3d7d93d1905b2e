// The config rules that span keys, applied by ParseConfig after every value
// passed its own check (common/internal/json_fields.h).
#ifndef ZO_COMMON_INTERNAL_CONFIG_RULES_H_
#define ZO_COMMON_INTERNAL_CONFIG_RULES_H_

#include <cstdint>

#include "absl/status/status.h"
#include "common/config.h"
#include "common/internal/json_fields.h"

namespace zo::config_internal {

// DeepSpeed's rule train_batch_size = train_micro_batch_size_per_gpu *
// gradient_accumulation_steps * dp_world_size. Zero marks a value not given;
// it is inferred from the others as DeepSpeed does (a missing
// gradient_accumulation_steps is 1 unless train_batch_size and the micro
// batch are both given). INVALID_ARGUMENT when they cannot agree.
absl::Status ResolveBatchSizes(int64_t dp_world_size, Config& config);

// fp16 vs bf16, NVMe paths and buffers, schedule length, TLS pairs, duplicate
// servers. Forces adam_w_mode for AdamW (with a warning) and notes when type
// Adam runs as AdamW.
absl::Status CheckAcrossKeys(Config& config, Diagnostics& diag);

}  // namespace zo::config_internal

#endif  // ZO_COMMON_INTERNAL_CONFIG_RULES_H_
