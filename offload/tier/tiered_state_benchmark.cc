// How well the NVMe-resident step overlaps I/O and compute, a sanity check
// beside `zo-bench nvme`:
//
//   tiered_state_benchmark [--dir=/tmp] [--elems_mi=256] [--sub_group_mi=16] [--buffers=4]
//                          [--steps=3] [--checksums=1] [--engine=auto|io_uring|pread]
//                          [--block_kib=1024] [--qd=8] [--threads=0]
//
// Workloads, each run --steps times and reported as the median:
//   compute  AdamStep with the whole state in RAM (fp32 gradient, fp16 copy)
//   io       IoOnlyPass with the whole state on NVMe (read + write every slot)
//   step     AdamStep with the whole state on NVMe
// and the ratio step / max(io, compute) (target <= 1.2). io and step take
// turns, so a disk whose speed drifts affects both alike.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "offload/aligned_buffer.h"
#include "offload/tier/tiered_state.h"

namespace zo {
namespace {

struct Flags {
  std::string dir = "/tmp";
  int64_t elems_mi = 256;
  int64_t sub_group_mi = 16;
  int buffers = 4;
  int steps = 5;
  int checksums = 1;
  std::string engine = "auto";
  int64_t block_kib = 1024;
  int qd = 8;
  int threads = 0;
};

double Seconds(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Seconds of one call.
template <typename Fn>
absl::StatusOr<double> Time(Fn fn) {
  const auto start = std::chrono::steady_clock::now();
  ZO_RETURN_IF_ERROR(fn());
  return Seconds(start);
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

absl::Status Fill(TieredOptimizerState& state, int64_t chunk) {
  std::vector<float> values(static_cast<size_t>(chunk));
  for (int64_t at = 0; at < state.total_elems(); at += chunk) {
    const int64_t n = std::min(chunk, state.total_elems() - at);
    for (int64_t i = 0; i < n; ++i) values[i] = static_cast<float>((at + i) % 1000) * 1e-3f;
    ZO_RETURN_IF_ERROR(state.LoadMaster(at, absl::MakeConstSpan(values).first(n)));
  }
  return absl::OkStatus();
}

absl::Status Run(const Flags& flags) {
  const int64_t total = flags.elems_mi << 20;
  ThreadPool pool(flags.threads);
  ZO_ASSIGN_OR_RETURN(AlignedBuffer grad, AlignedBuffer::Allocate(total * sizeof(float)));
  ZO_ASSIGN_OR_RETURN(AlignedBuffer fp16, AlignedBuffer::Allocate(total * 2));
  std::fill_n(grad.as<float>(), total, 1e-3f);
  std::fill_n(fp16.as<uint16_t>(), total, 0);
  AdamHyperParams hp;
  int step_number = 0;
  auto step = [&](TieredOptimizerState& state) {
    return state.AdamStep(MakeAdamStepConstants(hp, ++step_number, 1.0),
                          {grad.data(), DType::kFloat32}, {fp16.data(), DType::kFloat16});
  };

  TieredStateOptions options;
  options.sub_group_elems = flags.sub_group_mi << 20;
  options.buffer_count = flags.buffers;
  options.checksums = flags.checksums != 0;
  options.io.kind = flags.engine == "pread"      ? IoEngineKind::kPread
                    : flags.engine == "io_uring" ? IoEngineKind::kIoUring
                                                 : IoEngineKind::kAuto;
  options.io.block_size = static_cast<size_t>(flags.block_kib) << 10;
  options.io.queue_depth = flags.qd;

  std::vector<double> computes, ios, steps;
  {
    ZO_ASSIGN_OR_RETURN(auto ram, TieredOptimizerState::Create(options, total, &pool));
    ZO_RETURN_IF_ERROR(Fill(*ram, options.sub_group_elems));
    for (int i = 0; i < flags.steps; ++i) {
      ZO_ASSIGN_OR_RETURN(const double t, Time([&] { return step(*ram); }));
      computes.push_back(t);
    }
  }
  options.swap_dir = flags.dir + "/zo_tiered_state_benchmark";
  options.ram_budget_bytes = 0;
  ZO_ASSIGN_OR_RETURN(auto nvme, TieredOptimizerState::Create(options, total, &pool));
  ZO_RETURN_IF_ERROR(Fill(*nvme, options.sub_group_elems));
  for (int i = 0; i < flags.steps; ++i) {
    ZO_ASSIGN_OR_RETURN(const double io, Time([&] { return nvme->IoOnlyPass(); }));
    ZO_ASSIGN_OR_RETURN(const double t, Time([&] { return step(*nvme); }));
    ios.push_back(io);
    steps.push_back(t);
    std::printf("  round %d: io %.3f s, step %.3f s\n", i, io, t);
  }
  const double compute = Median(computes), io = Median(ios), step_s = Median(steps);

  const double state_gib = static_cast<double>(total) * 12 / (1 << 30);
  std::printf(
      "%lld Mi elements (%.2f GiB of state), sub-groups of %lld Mi, %d buffers, "
      "%d threads, engine %s, checksums %s\n",
      static_cast<long long>(flags.elems_mi), state_gib, static_cast<long long>(flags.sub_group_mi),
      flags.buffers, pool.size(), std::string(nvme->io_engine_name()).c_str(),
      options.checksums ? "on" : "off");
  std::printf("compute alone (RAM step)  %8.3f s\n", compute);
  std::printf("I/O alone (IoOnlyPass)    %8.3f s  (%.0f MiB/s read+write)\n", io,
              2 * state_gib * 1024 / io);
  std::printf("NVMe step                 %8.3f s\n", step_s);
  std::printf("step / max(io, compute)   %8.3f  (target <= 1.2)\n", step_s / std::max(io, compute));
  return absl::OkStatus();
}

bool ParseFlag(absl::string_view arg, Flags& flags) {
  auto value = [&](absl::string_view name) -> std::optional<absl::string_view> {
    const std::string prefix = absl::StrCat("--", name, "=");
    if (!absl::StartsWith(arg, prefix)) return std::nullopt;
    return arg.substr(prefix.size());
  };
  if (auto v = value("dir")) return flags.dir = std::string(*v), true;
  if (auto v = value("engine")) return flags.engine = std::string(*v), true;
  if (auto v = value("elems_mi")) return absl::SimpleAtoi(*v, &flags.elems_mi);
  if (auto v = value("sub_group_mi")) return absl::SimpleAtoi(*v, &flags.sub_group_mi);
  if (auto v = value("buffers")) return absl::SimpleAtoi(*v, &flags.buffers);
  if (auto v = value("steps")) return absl::SimpleAtoi(*v, &flags.steps);
  if (auto v = value("checksums")) return absl::SimpleAtoi(*v, &flags.checksums);
  if (auto v = value("block_kib")) return absl::SimpleAtoi(*v, &flags.block_kib);
  if (auto v = value("qd")) return absl::SimpleAtoi(*v, &flags.qd);
  if (auto v = value("threads")) return absl::SimpleAtoi(*v, &flags.threads);
  return false;
}

}  // namespace
}  // namespace zo

int main(int argc, char** argv) {
  zo::Flags flags;
  for (int i = 1; i < argc; ++i) {
    if (!zo::ParseFlag(argv[i], flags)) {
      std::fprintf(stderr, "unknown or bad flag %s\n", argv[i]);
      return 2;
    }
  }
  const absl::Status status = zo::Run(flags);
  if (!status.ok()) {
    std::fprintf(stderr, "%s\n", status.ToString().c_str());
    return 1;
  }
  return 0;
}
