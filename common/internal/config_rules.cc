#include "common/internal/config_rules.h"

#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"

namespace zo::config_internal {

absl::Status ResolveBatchSizes(int64_t dp_world_size, Config& c) {
  int64_t& total = c.train_batch_size;
  int64_t& micro = c.train_micro_batch_size_per_gpu;
  int64_t& gas = c.gradient_accumulation_steps;
  if (total == 0 && micro == 0) {
    return absl::InvalidArgumentError(
        "train_batch_size or train_micro_batch_size_per_gpu must be given (\"auto\" counts as "
        "absent)");
  }
  if (gas == 0 && (total == 0 || micro == 0)) gas = 1;
  const std::pair<const char*, int64_t*> factors[] = {
      {"train_micro_batch_size_per_gpu", &micro},
      {"gradient_accumulation_steps", &gas},
      {"dp_world_size", &dp_world_size},
  };
  int64_t product = 1;
  int64_t* unknown = nullptr;
  std::vector<std::string> terms;
  for (const auto& [name, value] : factors) {
    if (*value == 0) {
      unknown = value;
      continue;
    }
    terms.push_back(absl::StrCat(name, " ", *value));
    if (__builtin_mul_overflow(product, *value, &product)) {
      return absl::InvalidArgumentError(absl::StrCat(absl::StrJoin(terms, " * "), " overflows"));
    }
  }
  const std::string rhs = absl::StrJoin(terms, " * ");
  if (total == 0) {
    total = product;
  } else if (unknown == nullptr) {
    if (total != product) {
      return absl::InvalidArgumentError(absl::StrCat("train_batch_size ", total, " != ", rhs));
    }
  } else if (total % product != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("train_batch_size ", total, " is not divisible by ", rhs));
  } else {
    *unknown = total / product;
  }
  return absl::OkStatus();
}

namespace {

absl::Status CheckOffloads(const ZeroConfig& zero) {
  struct Offload {
    const char* path;
    OffloadDevice device;
    const std::string& nvme_path;
    int buffer_count;
    int min_nvme_buffers;  // the swap pipeline reads, updates and writes at once
  };
  const Offload offloads[] = {
      {"zero_optimization.offload_optimizer", zero.offload_optimizer.device,
       zero.offload_optimizer.nvme_path, zero.offload_optimizer.buffer_count, 3},
      {"zero_optimization.offload_param", zero.offload_param.device, zero.offload_param.nvme_path,
       zero.offload_param.buffer_count, 1},
  };
  for (const Offload& o : offloads) {
    if (o.device != OffloadDevice::kNvme) continue;
    if (o.nvme_path.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(o.path, ".nvme_path: required when device is nvme"));
    }
    if (o.buffer_count < o.min_nvme_buffers) {
      return ValueError(absl::StrCat(o.path, ".buffer_count"), o.buffer_count,
                        absl::StrCat("must be >= ", o.min_nvme_buffers, " with device nvme"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckZoSection(const ZoConfig& zo) {
  const AuthConfig& auth = zo.auth;
  if (auth.tls_cert.empty() != auth.tls_key.empty()) {
    const bool has_cert = !auth.tls_cert.empty();
    return absl::InvalidArgumentError(absl::StrCat("zo.auth.", has_cert ? "tls_key" : "tls_cert",
                                                   ": required when zo.auth.",
                                                   has_cert ? "tls_cert" : "tls_key", " is given"));
  }
  std::set<std::string> servers;
  for (size_t i = 0; i < zo.servers.size(); ++i) {
    if (!servers.insert(zo.servers[i]).second) {
      return ValueError(absl::StrCat("zo.servers[", i, "]"), zo.servers[i], "duplicate server");
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckAcrossKeys(Config& c, Diagnostics& diag) {
  if (c.fp16.enabled && c.bf16.enabled) {
    return absl::InvalidArgumentError("fp16.enabled and bf16.enabled are both true: pick one");
  }
  ZO_RETURN_IF_ERROR(CheckOffloads(c.zero_optimization));
  ZO_RETURN_IF_ERROR(CheckZoSection(c.zo));
  if (c.zo.client_lr && c.scheduler.has_value()) {
    return absl::InvalidArgumentError(
        "zo.client_lr is true and a scheduler section is given: the learning rate comes either "
        "from the worker each step (zo.torch's param_groups, a torch lr_scheduler) or from the "
        "config's scheduler; remove one");
  }
  if (c.zo.dpu.compensation != DpuCompensation::kNone) {
    const std::string what =
        absl::StrCat("zo.dpu.compensation \"", std::string(EnumName(c.zo.dpu.compensation)), "\"");
    if (!c.zo.dpu.enabled) {
      return absl::InvalidArgumentError(absl::StrCat(what, " needs zo.dpu.enabled true"));
    }
    if (c.optimizer.type != OptimizerType::kAdam && c.optimizer.type != OptimizerType::kAdamW) {
      return absl::InvalidArgumentError(absl::StrCat(what, " is for Adam and AdamW, not ",
                                                     std::string(EnumName(c.optimizer.type))));
    }
    const bool l2_decay =
        c.optimizer.type == OptimizerType::kAdam && !c.optimizer.params.adam_w_mode;
    bool decays = c.optimizer.params.weight_decay > 0;
    for (const ParamGroupConfig& g : c.zo.param_groups) decays = decays || g.weight_decay > 0;
    if (l2_decay && decays) {
      return absl::InvalidArgumentError(absl::StrCat(
          what,
          " needs decoupled weight decay (AdamW, or adam_w_mode true): L2 decay enters the "
          "gradient, which the worker's part of the update does not hold"));
    }
  }
  if (!c.zo.param_groups.empty() && c.optimizer.type != OptimizerType::kAdam &&
      c.optimizer.type != OptimizerType::kAdamW) {
    return absl::InvalidArgumentError(
        absl::StrCat("zo.param_groups: per-group hyper-parameters are for Adam and AdamW, not ",
                     std::string(EnumName(c.optimizer.type))));
  }
  if (c.scheduler.has_value() && c.scheduler->type != SchedulerType::kWarmupLR) {
    const SchedulerParams& p = c.scheduler->params;
    if (p.total_num_steps <= p.warmup_num_steps) {
      return ValueError("scheduler.params.total_num_steps", p.total_num_steps,
                        absl::StrCat("must be > warmup_num_steps ", p.warmup_num_steps));
    }
  }
  OptimizerParams& adam = c.optimizer.params;
  if (c.optimizer.type == OptimizerType::kAdamW && !adam.adam_w_mode) {
    diag.warnings.push_back(
        "optimizer.params.adam_w_mode = false ignored: type AdamW always decouples weight decay "
        "(for L2 decay use type Adam with adam_w_mode false)");
    adam.adam_w_mode = true;
  }
  if (c.optimizer.type == OptimizerType::kAdam && adam.adam_w_mode && adam.weight_decay > 0) {
    diag.notes.push_back(
        "optimizer type Adam runs as AdamW (decoupled weight decay) because adam_w_mode defaults "
        "to true in DeepSpeed; set optimizer.params.adam_w_mode false for Adam's L2 decay");
  }
  return absl::OkStatus();
}

}  // namespace zo::config_internal
