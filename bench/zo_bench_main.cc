// zo-bench: reproducible system benchmarks, each printing a roofline ratio
// measured in the same run (docs/architecture.md, "Performance"). Workloads:
//
//   adam   RAM-resident fused CPU Adam step vs. a STREAM-style kernel with
//          the same memory traffic, per SIMD path and thread count
//   nvme   raw O_DIRECT I/O of our engine vs. fio on the same file, and the
//          pipelined Adam step over NVMe-resident state vs. max(I/O, compute)
//   wire   gradient push (OffloadClient -> OffloadServer in a child process)
//          over loopback vs. a plain TCP stream between the same processes
//   offload  push + update + pull of one step per data-plane route vs. the
//          Adam alone
//   scale  the server tier on 1, 2, 4 server hosts (network namespaces) with
//          capped links: step time vs. the one-host step
//   checkpoint  training steps with a checkpoint every N steps written in the
//          background, and with the worker waiting for each, vs. none
//   gpu    (CUDA builds) a large GEMM's TFLOP/s and a GPT-2-small step's
//          MFU against it, on one GPU
//
// Usage: zo-bench [flags] <workload>...
#include <iostream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/usage.h"
#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "bench/adam_bench.h"
#include "bench/checkpoint_bench.h"
#include "bench/fio.h"
#ifdef ZO_HAVE_CUDA
#include "bench/gpu_bench.h"
#endif
#include "bench/nvme_bench.h"
#include "bench/offload_bench.h"
#include "bench/scale_bench.h"
#include "bench/stream_bench.h"
#include "bench/wire_bench.h"
#include "common/command_line.h"
#include "common/dtype.h"
#include "common/status_macros.h"
#include "common/units.h"

ABSL_FLAG(std::string, params, "",
          "adam, nvme, offload: parameter count; 256Mi = 268435456, also 64M (decimal), 1e8, "
          "1000000 (default: adam 256Mi, nvme 64Mi, offload 64Mi)");
ABSL_FLAG(std::string, grad_dtype, "fp16",
          "adam: gradient dtype the step reads: fp16, bf16 or fp32 (the copy written is bf16 "
          "for bf16 gradients, fp16 otherwise)");
ABSL_FLAG(std::string, threads, "",
          "adam: comma-separated thread counts, e.g. 1,2,8 (default: every count from 1 to "
          "the number of cores); nvme: one count for the step (default: all cores); "
          "checkpoint: the server's optimizer threads (default: one per core)");
ABSL_FLAG(int, rounds, 0,
          "timed rounds (default: adam 7, nvme 5). adam: per (path, threads), after one "
          "warm-up, the step and the baseline once each, alternating which goes first. "
          "nvme: per direction one fio run and one zo pass, alternating which goes first; "
          "for the step part, one each of step, I/O alone and compute alone, rotating. "
          "wire: after --warmup-rounds, a gRPC push and a TCP stream each, alternating which "
          "goes first (default 5)");
ABSL_FLAG(int, warmup_rounds, 3,
          "wire: untimed rounds of each transfer before the timed ones (HTTP/2 windows and "
          "the server's buffers grow over the first few)");
ABSL_FLAG(std::string, chunk_elems, "4Mi",
          "adam: elements per chunk the parameters are cut into, as on a server; wire: the "
          "job's zo.chunk_elems");
ABSL_FLAG(bool, json, false, "print one JSON object per result line instead of a table");
ABSL_FLAG(std::string, dir, "/var/tmp",
          "nvme: directory on the device to measure; a scratch folder zo-bench-nvme-PID is made "
          "in it and removed afterwards. checkpoint: where the checkpoints go (a scratch "
          "folder zo-bench-checkpoint-PID)");
ABSL_FLAG(std::string, size, "1GiB",
          "nvme: raw I/O file size in bytes, or with K, M, G, T (powers of 1024, as fio): 1G, "
          "1GiB, 1073741824");
ABSL_FLAG(std::string, bs, "1MiB",
          "nvme: block size of each request (fio's --bs and the engine's block size): a power "
          "of two >= 4K");
ABSL_FLAG(int, qd, 8, "nvme: requests in flight (fio's --iodepth and the engine's queue depth)");
ABSL_FLAG(std::string, engine, "auto",
          "nvme: our engine: auto (io_uring, else the pread pool), io_uring or pread");
ABSL_FLAG(std::string, fio, "fio", "nvme: the fio binary (searched in PATH)");
ABSL_FLAG(std::string, fio_engine, "io_uring", "nvme: fio's --ioengine: io_uring or libaio");
ABSL_FLAG(std::string, fio_args, "",
          "nvme: more fio options, space-separated, appended to its command line, e.g. "
          "--fio-args=\"--fixedbufs=1 --registerfiles=1\" (default: none, fio's defaults)");
ABSL_FLAG(std::string, parts, "io,step",
          "nvme: what to run: io (raw I/O vs. fio), step (NVMe-resident Adam step), or both");
ABSL_FLAG(std::string, sub_group, "4Mi",
          "nvme: elements per sub-group of the step's state (sub_group_size); 12 bytes each "
          "on disk");
ABSL_FLAG(int, buffer_count, 4, "nvme: the step pipeline's buffers (>= 3)");
ABSL_FLAG(std::string, bytes, "256Mi",
          "wire: gradient bytes per round (fp16, so an even count): 256Mi, 1Gi, 8M ...");
ABSL_FLAG(std::string, piece_bytes, "1Mi",
          "wire: payload bytes per GradientPiece (ClientOptions::max_piece_bytes), also the "
          "size of each send() of the TCP baseline");
ABSL_FLAG(std::string, in_flight_bytes, "64Mi",
          "wire: gradient bytes queued and not yet written (ClientOptions::max_bytes_in_flight)");
ABSL_FLAG(int, gpu, 0, "gpu: which CUDA device");
ABSL_FLAG(std::string, dtype, "bf16",
          "gpu: storage dtype of the GEMM and the step: bf16 or fp16; offload: the job's dtype "
          "(gradients pushed, weights pulled): bf16, fp16 or fp32");
ABSL_FLAG(std::string, routes, "in_process,grpc_in_process,same_host,tcp",
          "offload: the data plane's routes to measure, comma-separated");
ABSL_FLAG(int, micro_batches, 1,
          "offload: gradients pushed per tensor per step, one per micro-batch, summed on the "
          "servers (zo.gradient_accumulation \"servers\"); 1: summed on the worker");
ABSL_FLAG(int, batch, 16, "gpu: sequences per micro-batch of the GPT step");
ABSL_FLAG(int, block_size, 1024, "gpu: the GPT's context (tokens per sequence)");
ABSL_FLAG(int, n_layer, 12, "gpu: the GPT's blocks");
ABSL_FLAG(int, n_embd, 768, "gpu: the GPT's width");
ABSL_FLAG(int, n_head, 12, "gpu: the GPT's attention heads");
ABSL_FLAG(int, steps, 5, "gpu: timed steps, after 2 untimed ones");
ABSL_FLAG(std::string, stream_shape, "8x256",
          "stream: the GPT, LAYERSxWIDTH (heads of 32, block 128, 8 sequences x 2 "
          "micro-batches)");
ABSL_FLAG(double, stream_window, 0.25,
          "stream: the streamed runs' parameters on the device, as a share of the model's");
ABSL_FLAG(std::string, stream_device, "cpu", "stream: zo-train's --device (cpu, cuda, auto)");
ABSL_FLAG(std::string, stream_nvme, "",
          "stream: the streamed runs keep their weights in a file in this directory "
          "(offload_param \"nvme\"); empty: in host memory");
ABSL_FLAG(std::string, gemm_size, "8192", "gpu: the peak GEMM is N x N x N");
ABSL_FLAG(std::string, rows, "gemm,step,dpu,sync",
          "gpu: rows to run, comma-separated: gemm,step (always together), dpu and sync (need "
          "step), largest");
ABSL_FLAG(std::string, largest, "36x3072x24",
          "gpu: gpu_largest's GPT as LAYERSxWIDTHxHEADS (default 4.1B parameters)");
ABSL_FLAG(int, largest_steps, 20, "gpu: gpu_largest's steps (block 1024, 4 sequences each)");
ABSL_FLAG(double, largest_lr, 1e-7,
          "gpu: gpu_largest's (peak) lr; Adam's sign-like first steps blow a 4B GPT up above "
          "about 1e-6");
ABSL_FLAG(int, largest_warmup_steps, 0, "gpu: gpu_largest's linear lr warmup; 0: none");
ABSL_FLAG(std::string, largest_gradient_accumulation, "auto",
          "gpu: gpu_largest's zo.gradient_accumulation: auto, device (fp32 gradients on the GPU) "
          "or servers (none kept there)");
ABSL_FLAG(std::string, largest_device_memory_budget, "",
          "gpu: gpu_largest streams its weights through a window planned for this much device "
          "memory (zo-train --device-memory-budget, e.g. 60GiB); empty: every weight resident");
ABSL_FLAG(std::string, largest_nvme, "",
          "gpu: gpu_largest keeps its optimizer state on NVMe in this directory, and with "
          "--largest-device-memory-budget its streamed weights too; empty: in RAM");
ABSL_FLAG(int64_t, link_mbit, 1000,
          "scale: each server host's link cap, Mbit/s each way; 0: uncapped");
ABSL_FLAG(std::string, connections, "2",
          "zo.connections_per_server: scale, the counts to time, comma-separated (each server "
          "count with each); offload, the one count of its tcp route");
ABSL_FLAG(std::string, server_hosts, "1,2,4",
          "scale: server host counts, comma-separated; the first is the efficiency baseline");
ABSL_FLAG(bool, scale_dpu, false,
          "scale: pull the weights of the step before, as a worker with the delayed parameter "
          "update does, so the servers' update overlaps the next push instead of sitting in "
          "every step");
ABSL_FLAG(std::string, scale_params, "32Mi",
          "scale: fp16 elements of the job, pushed as gradients and pulled as weights each step");
ABSL_FLAG(int, checkpoint_every, 10, "checkpoint: steps between checkpoints");
ABSL_FLAG(bool, checkpoint_dpu, false,
          "checkpoint: run the job with the delayed parameter update (the worker pulls the "
          "version before the one it pushed; each checkpoint also holds that version)");
ABSL_FLAG(int, checkpoint_steps, 30, "checkpoint: steps per timed segment of each mode");
ABSL_FLAG(std::string, compute_ms, "",
          "the worker's compute per step in ms, standing in for a GPU's forward and backward "
          "(the worker's CPU idles). checkpoint: before it pushes (default 0: the servers' "
          "step is the whole step). offload: adds rows `overlap` per route, without and with "
          "DPU (plain and compensated), the pushes following the backward's slices; auto: as "
          "long as the route's step without compute");
ABSL_FLAG(std::string, overlap_pulls, "version",
          "offload: the overlap rows' worker pulls the next step's weights in one pull waited "
          "for before the forward, as zo-train does (version), or a tensor at a time, each "
          "tensor's part of the forward starting once its weights are in (tensor; not with "
          "DPU, whose worker takes whole versions)");
ABSL_FLAG(bool, checksums, true,
          "nvme: the step's block checksums, on as a server runs them (--nochecksums: off)");

namespace zo {
namespace {

constexpr char kUsage[] =
    "zo benchmarks; each prints a ratio against a baseline measured in the same run.\n\n"
    "usage: zo-bench [flags] <workload>...\n\n"
    "workloads:\n"
    "  adam   fused CPU Adam step over --params elements (p, m, v fp32 + a gradient and a\n"
    "         16-bit copy, in chunks of --chunk-elems), for each SIMD path the CPU has\n"
    "         (scalar, avx2, avx512) and each thread count, vs. a STREAM-style loop\n"
    "         moving the same bytes; ratio = median over rounds of the two speeds.\n"
    "         Results on stdout (table or --json lines), progress on stderr.\n"
    "         ZO_SIMD=scalar|avx2|avx512 changes which path counts as dispatched.\n"
    "  nvme   in a scratch folder under --dir: (io) sequential O_DIRECT read and write of a\n"
    "         --size file in --bs requests --qd deep, by fio (--fio-engine) and by our\n"
    "         engine (--engine), alternating for --rounds rounds; ratio = median of the\n"
    "         per-round zo/fio throughput ratios (target >= 0.90). (step) one Adam step\n"
    "         over --params elements of state all on NVMe in --sub-group sub-groups, vs.\n"
    "         the same pipeline doing only the I/O and the same kernel in RAM; ratio =\n"
    "         median of per-round step / max(io, compute) (target <= 1.2). Prints the\n"
    "         device and filesystem the files sat on. Needs fio (apt-get install fio).\n"
    "  wire   forks a server process (an OffloadServer and a TCP sink on 127.0.0.1) and\n"
    "         pushes --bytes of fp16 gradients per round to it with the client library\n"
    "         (pieces of --piece-bytes, until FinishStep's acknowledgement), vs. the same\n"
    "         bytes in --piece-bytes send() calls on one TCP connection to the sink, for\n"
    "         --rounds rounds after --warmup-rounds; ratio = median grpc GB/s / median tcp GB/s\n"
    "         (target >= 0.8). Run it on its own (it forks before starting threads).\n"
    "  offload one optimizer step as a worker sees it, with no compute: push --params\n"
    "         gradients of --dtype (bf16) in 16 tensors, the server's update, pull every\n"
    "         weight, through each of --routes: in_process (the embedded server's in-process\n"
    "         route), grpc_in_process (its in-process gRPC channel), same_host (the\n"
    "         shared-memory region, headers over loopback TCP; gradients pushed from\n"
    "         their places in the region and weights pulled into it, as zo-train does;\n"
    "         micro-batches copy theirs in), tcp (everything over gRPC\n"
    "         on loopback; both to a server in this process); vs. the fused Adam alone\n"
    "         over as many elements with the same --threads (one count; default all cores),\n"
    "         alternating, --rounds each (default 5) after a warm-up; ratio = median step /\n"
    "         median adam (targets: in_process <= 1.3, same_host <= 1.5); the server\n"
    "         speculates, as by default. --micro-batches N pushes every gradient N times\n"
    "         a step, summed on the servers (zo.gradient_accumulation \"servers\");\n"
    "         --connections N: the tcp route's TCP connections (zo.connections_per_server,\n"
    "         default 2). Rows {bench, row: step, route, dtype, params, step_s, push_s,\n"
    "         update_pull_s, adam_s, ratio, speculative, micro_batches, connections} with\n"
    "         --json.\n"
    "         --compute-ms X (ms, or auto: the route's step) adds rows overlap per route:\n"
    "         synchronous, speculative (each chunk updated as its gradients come in),\n"
    "         DPU, and DPU compensated (each delayed step also waits for the step\n"
    "         before's decision, GetStepCompensation; the worker's combine, a GPU's\n"
    "         fraction of a millisecond, is left out): each step takes the version it\n"
    "         computes on, starts pulling the next one (in one pull; --overlap-pulls\n"
    "         tensor: a pull per tensor, and each 16th of the forward waits for its\n"
    "         tensor's, without DPU), idles X/3 (a forward), then 2X/3 in 16 slices,\n"
    "         handing a tensor to a pushing thread after each (a backward; per\n"
    "         micro-batch, each 1/N of that), and ends the step once all are pushed;\n"
    "         the compute keeps a device's clock (a late wake-up on a busy CPU does not\n"
    "         lengthen it); ratio = median step / max(X, the route's step alone);\n"
    "         synchronous it is about 2 at auto by construction (target speculative:\n"
    "         <= 1.2). Rows add pulls (version or tensor).\n"
    "  scale  network namespaces as hosts: a worker host and --server-hosts server hosts\n"
    "         whose links tc caps at --link-mbit each way (0: uncapped); per count k, k\n"
    "         zo-servers hold a job of --scale-params fp16 elements (chunks of\n"
    "         --chunk-elems) and the worker, over --connections TCP connections to each\n"
    "         (zo.connections_per_server; a list times each), times --rounds steps of\n"
    "         push, acknowledgement and pull after one warm-up (--scale-dpu: pulling the\n"
    "         step before's weights, as with DPU); efficiency = T(1) / (k T(k)) (target\n"
    "         >= 0.9 at 4). The hosts share this\n"
    "         machine's cores, so without DPU the servers' update does not shrink with k.\n"
    "         Needs root; run it on its own (it forks before starting threads).\n"
    "  checkpoint  an in-process server on loopback with a checkpoint directory under\n"
    "         --dir and a job of --params fp16 elements (default 32Mi) whose state is in\n"
    "         RAM; the worker pushes, waits for the acknowledgement and pulls, so the\n"
    "         servers' step is the whole step. Segments of --checkpoint-steps steps with\n"
    "         no checkpoint, with one every --checkpoint-every steps finishing in the\n"
    "         background (as zo-train asks), and with the worker waiting for each,\n"
    "         rotating, --rounds each (default 3); ratio = median background steps/s /\n"
    "         median steps/s without (target >= 0.95). --compute-ms adds a worker compute\n"
    "         time per step (a GPU's forward and backward; the CPU idles meanwhile);\n"
    "         --checkpoint-dpu runs the job with the delayed parameter update.\n"
    "  gpu    (builds with CUDA) on CUDA device --gpu: a --gemm-size^3 --dtype GEMM through\n"
    "         cuBLASLt (the attainable peak), then forward + backward steps of a GPT\n"
    "         (--n-layer, --n-embd, --n-head, --block-size; vocabulary 50304; --batch\n"
    "         sequences) with weights on the device and no servers; ratio = model FLOP/s\n"
    "         (PaLM's: 6 x non-embedding parameters + 12 L C T per token) / that peak, i.e.\n"
    "         MFU (target >= 0.45), and the\n"
    "         share of the step its GEMMs take. Rows gpu_gemm and gpu_step. Rows gpu_dpu\n"
    "         and gpu_sync: the same GPT trained against an embedded server (in-process\n"
    "         route) with and without DPU; ratio = step time / compute alone (target <=\n"
    "         1.3); ratio_to_slower = step / max(compute alone, the server's push-update-pull\n"
    "         step alone).\n"
    "         Row gpu_largest (--rows ...,largest): zo-train's loop on a --largest GPT for\n"
    "         --largest-steps steps with an embedded server: parameters, losses, step time,\n"
    "         peak GPU and host memory; --largest-device-memory-budget streams its weights\n"
    "         and --largest-nvme keeps the optimizer state on NVMe, with a budget the\n"
    "         streamed weights too (ZeRO-Infinity's shape).\n"
    "         --rows picks the rows.\n"
    "  stream zo-train's loop with an embedded server on --stream-device (cpu) trains a\n"
    "         GPT (--stream-shape LAYERSxWIDTH) for 2 x --steps steps with every weight on\n"
    "         the device, then streaming its parameters with --stream-window of them there\n"
    "         (zero_optimization.offload_param; --stream-nvme DIR keeps the rest in a\n"
    "         file there), alternating --rounds times (default 2);\n"
    "         the losses must match bit for bit; ratio = median streamed step / median\n"
    "         resident step over each run's second half (target on a GPU: <= 1.15).\n\n"
    "Flags may be written with dashes or underscores.";

absl::StatusOr<bench::AdamBenchOptions> AdamOptionsFromFlags() {
  bench::AdamBenchOptions o;
  const std::string params = absl::GetFlag(FLAGS_params);
  ZO_ASSIGN_OR_RETURN(o.params, ParseCount(params.empty() ? "256Mi" : params));
  ZO_ASSIGN_OR_RETURN(int64_t chunk, ParseCount(absl::GetFlag(FLAGS_chunk_elems)));
  o.chunk_elems = static_cast<size_t>(chunk);
  const std::string dtype = absl::GetFlag(FLAGS_grad_dtype);
  const std::optional<DType> parsed = ParseDType(dtype);
  if (!parsed) {
    return absl::InvalidArgumentError("--grad-dtype must be fp16, bf16 or fp32, got '" + dtype +
                                      "'");
  }
  o.grad_dtype = *parsed;
  const std::string threads = absl::GetFlag(FLAGS_threads);
  if (!threads.empty()) {
    for (const std::string& t : std::vector<std::string>(absl::StrSplit(threads, ','))) {
      int n = 0;
      if (!absl::SimpleAtoi(t, &n) || n < 1) {
        return absl::InvalidArgumentError("--threads wants counts >= 1 like 1,2,4, got '" +
                                          threads + "'");
      }
      o.threads.push_back(n);
    }
  }
  const int rounds = absl::GetFlag(FLAGS_rounds);
  o.rounds = rounds == 0 ? 7 : rounds;
  o.json = absl::GetFlag(FLAGS_json);
  return o;
}

// Runs a workload on its options from the flags; a bad flag or a failed run
// is one line on stderr and exit code 2.
template <typename Options>
int RunWorkload(const char* name, absl::StatusOr<Options> options,
                absl::Status (*run)(const Options&, std::ostream&)) {
  const absl::Status status = options.ok() ? run(*options, std::cout) : options.status();
  if (!status.ok()) {
    std::cerr << "zo-bench " << name << ": " << status.message() << "\n";
    return 2;
  }
  return 0;
}

int RunAdam() { return RunWorkload("adam", AdamOptionsFromFlags(), &bench::RunAdamBench); }

absl::StatusOr<bench::NvmeBenchOptions> NvmeOptionsFromFlags() {
  bench::NvmeBenchOptions o;
  o.dir = absl::GetFlag(FLAGS_dir);
  ZO_ASSIGN_OR_RETURN(o.size, bench::ParseByteSize(absl::GetFlag(FLAGS_size)));
  ZO_ASSIGN_OR_RETURN(o.bs, bench::ParseByteSize(absl::GetFlag(FLAGS_bs)));
  o.qd = absl::GetFlag(FLAGS_qd);
  const int rounds = absl::GetFlag(FLAGS_rounds);
  o.rounds = rounds == 0 ? 5 : rounds;
  const std::string engine = absl::GetFlag(FLAGS_engine);
  if (engine == "auto") {
    o.engine = IoEngineKind::kAuto;
  } else if (engine == "io_uring") {
    o.engine = IoEngineKind::kIoUring;
  } else if (engine == "pread") {
    o.engine = IoEngineKind::kPread;
  } else {
    return absl::InvalidArgumentError("--engine must be auto, io_uring or pread, got '" + engine +
                                      "'");
  }
  o.fio = absl::GetFlag(FLAGS_fio);
  o.fio_engine = absl::GetFlag(FLAGS_fio_engine);
  o.fio_args =
      absl::StrSplit(absl::GetFlag(FLAGS_fio_args), absl::ByAnyChar(" \t"), absl::SkipEmpty());
  o.raw = o.step = false;
  const std::string parts = absl::GetFlag(FLAGS_parts);
  for (const std::string& part : std::vector<std::string>(absl::StrSplit(parts, ','))) {
    if (part == "io") {
      o.raw = true;
    } else if (part == "step") {
      o.step = true;
    } else {
      return absl::InvalidArgumentError("--parts wants io, step or io,step, got '" + parts + "'");
    }
  }
  const std::string params = absl::GetFlag(FLAGS_params);
  ZO_ASSIGN_OR_RETURN(o.params, ParseCount(params.empty() ? "64Mi" : params));
  ZO_ASSIGN_OR_RETURN(o.sub_group_elems, ParseCount(absl::GetFlag(FLAGS_sub_group)));
  o.buffer_count = absl::GetFlag(FLAGS_buffer_count);
  const std::string threads = absl::GetFlag(FLAGS_threads);
  if (!threads.empty() && (!absl::SimpleAtoi(threads, &o.threads) || o.threads < 1)) {
    return absl::InvalidArgumentError("--threads wants one count >= 1 for nvme, got '" + threads +
                                      "'");
  }
  o.checksums = absl::GetFlag(FLAGS_checksums);
  o.json = absl::GetFlag(FLAGS_json);
  return o;
}

int RunNvme() { return RunWorkload("nvme", NvmeOptionsFromFlags(), &bench::RunNvmeBench); }

absl::StatusOr<bench::WireBenchOptions> WireOptionsFromFlags() {
  bench::WireBenchOptions o;
  ZO_ASSIGN_OR_RETURN(const uint64_t bytes, bench::ParseByteSize(absl::GetFlag(FLAGS_bytes)));
  o.bytes = static_cast<int64_t>(bytes);
  ZO_ASSIGN_OR_RETURN(const uint64_t piece, bench::ParseByteSize(absl::GetFlag(FLAGS_piece_bytes)));
  o.piece_bytes = static_cast<int64_t>(piece);
  ZO_ASSIGN_OR_RETURN(const uint64_t in_flight,
                      bench::ParseByteSize(absl::GetFlag(FLAGS_in_flight_bytes)));
  o.in_flight_bytes = static_cast<int64_t>(in_flight);
  ZO_ASSIGN_OR_RETURN(o.chunk_elems, ParseCount(absl::GetFlag(FLAGS_chunk_elems)));
  const int rounds = absl::GetFlag(FLAGS_rounds);
  o.rounds = rounds == 0 ? 5 : rounds;
  o.warmup_rounds = absl::GetFlag(FLAGS_warmup_rounds);
  o.json = absl::GetFlag(FLAGS_json);
  return o;
}

int RunWire() { return RunWorkload("wire", WireOptionsFromFlags(), &bench::RunWireBench); }

// "1,2,4" -> {1, 2, 4}; `flag` names the flag in the error.
absl::StatusOr<std::vector<int>> ParseIntList(const std::string& flag, const std::string& text) {
  std::vector<int> out;
  for (const std::string& item : std::vector<std::string>(absl::StrSplit(text, ','))) {
    int n = 0;
    if (!absl::SimpleAtoi(item, &n)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", flag, " wants counts like 1,2,4, got '", item, "'"));
    }
    out.push_back(n);
  }
  return out;
}

absl::StatusOr<bench::ScaleBenchOptions> ScaleOptionsFromFlags() {
  bench::ScaleBenchOptions o;
  ZO_ASSIGN_OR_RETURN(o.servers, ParseIntList("server-hosts", absl::GetFlag(FLAGS_server_hosts)));
  o.link_mbit = absl::GetFlag(FLAGS_link_mbit);
  ZO_ASSIGN_OR_RETURN(o.connections, ParseIntList("connections", absl::GetFlag(FLAGS_connections)));
  o.dpu = absl::GetFlag(FLAGS_scale_dpu);
  ZO_ASSIGN_OR_RETURN(o.params, ParseCount(absl::GetFlag(FLAGS_scale_params)));
  ZO_ASSIGN_OR_RETURN(o.chunk_elems, ParseCount(absl::GetFlag(FLAGS_chunk_elems)));
  const int rounds = absl::GetFlag(FLAGS_rounds);
  o.rounds = rounds == 0 ? 3 : rounds;
  o.json = absl::GetFlag(FLAGS_json);
  return o;
}

absl::StatusOr<bench::OffloadBenchOptions> OffloadOptionsFromFlags() {
  bench::OffloadBenchOptions o;
  const std::string params = absl::GetFlag(FLAGS_params);
  ZO_ASSIGN_OR_RETURN(o.params, ParseCount(params.empty() ? "64Mi" : params));
  ZO_ASSIGN_OR_RETURN(o.chunk_elems, ParseCount(absl::GetFlag(FLAGS_chunk_elems)));
  const std::string dtype = absl::GetFlag(FLAGS_dtype);
  const std::optional<DType> parsed = ParseDType(dtype);
  if (!parsed) {
    return absl::InvalidArgumentError("--dtype must be bf16, fp16 or fp32, got '" + dtype + "'");
  }
  o.dtype = *parsed;
  o.routes = absl::StrSplit(absl::GetFlag(FLAGS_routes), ',', absl::SkipEmpty());
  o.micro_batches = absl::GetFlag(FLAGS_micro_batches);
  ZO_ASSIGN_OR_RETURN(const std::vector<int> connections,
                      ParseIntList("connections", absl::GetFlag(FLAGS_connections)));
  if (connections.size() != 1 || connections[0] < 1 ||
      connections[0] > ZoConfig::kMaxConnectionsPerServer) {
    return absl::InvalidArgumentError(absl::StrCat("--connections takes one count, 1 to ",
                                                   ZoConfig::kMaxConnectionsPerServer, ", got '",
                                                   absl::GetFlag(FLAGS_connections), "'"));
  }
  o.connections = connections[0];
  const std::string threads = absl::GetFlag(FLAGS_threads);
  if (!threads.empty() && (!absl::SimpleAtoi(threads, &o.threads) || o.threads < 1)) {
    return absl::InvalidArgumentError("offload: --threads wants one count >= 1, got '" + threads +
                                      "'");
  }
  const std::string compute = absl::GetFlag(FLAGS_compute_ms);
  o.overlap = !compute.empty();
  if (o.overlap && compute != "auto" &&
      (!absl::SimpleAtod(compute, &o.compute_ms) || !(o.compute_ms > 0))) {
    return absl::InvalidArgumentError("offload: --compute-ms wants ms > 0 or auto, got '" +
                                      compute + "'");
  }
  const std::string pulls = absl::GetFlag(FLAGS_overlap_pulls);
  if (pulls != "tensor" && pulls != "version") {
    return absl::InvalidArgumentError("offload: --overlap-pulls wants tensor or version, got '" +
                                      pulls + "'");
  }
  o.pull_per_tensor = pulls == "tensor";
  const int rounds = absl::GetFlag(FLAGS_rounds);
  o.rounds = rounds == 0 ? 5 : rounds;
  o.json = absl::GetFlag(FLAGS_json);
  return o;
}

int RunOffload() {
  return RunWorkload("offload", OffloadOptionsFromFlags(), &bench::RunOffloadBench);
}

int RunScale() { return RunWorkload("scale", ScaleOptionsFromFlags(), &bench::RunScaleBench); }

absl::StatusOr<bench::CheckpointBenchOptions> CheckpointOptionsFromFlags() {
  bench::CheckpointBenchOptions o;
  const std::string params = absl::GetFlag(FLAGS_params);
  ZO_ASSIGN_OR_RETURN(o.params, ParseCount(params.empty() ? "32Mi" : params));
  ZO_ASSIGN_OR_RETURN(o.chunk_elems, ParseCount(absl::GetFlag(FLAGS_chunk_elems)));
  o.every = absl::GetFlag(FLAGS_checkpoint_every);
  o.steps = absl::GetFlag(FLAGS_checkpoint_steps);
  o.dpu = absl::GetFlag(FLAGS_checkpoint_dpu);
  const std::string compute = absl::GetFlag(FLAGS_compute_ms);
  if (!compute.empty() && (!absl::SimpleAtoi(compute, &o.compute_ms) || o.compute_ms < 0)) {
    return absl::InvalidArgumentError("checkpoint: --compute-ms wants whole ms >= 0, got '" +
                                      compute + "'");
  }
  const int rounds = absl::GetFlag(FLAGS_rounds);
  o.rounds = rounds == 0 ? 3 : rounds;
  o.dir = absl::GetFlag(FLAGS_dir);
  o.json = absl::GetFlag(FLAGS_json);
  const std::string threads = absl::GetFlag(FLAGS_threads);
  if (!threads.empty() && (!absl::SimpleAtoi(threads, &o.threads) || o.threads < 1)) {
    return absl::InvalidArgumentError("--threads wants one count >= 1 for checkpoint, got '" +
                                      threads + "'");
  }
  return o;
}

int RunCheckpoint() {
  return RunWorkload("checkpoint", CheckpointOptionsFromFlags(), &bench::RunCheckpointBench);
}

#ifdef ZO_HAVE_CUDA
absl::StatusOr<bench::GpuBenchOptions> GpuOptionsFromFlags() {
  bench::GpuBenchOptions o;
  o.device = absl::GetFlag(FLAGS_gpu);
  const std::string dtype = absl::GetFlag(FLAGS_dtype);
  const std::optional<DType> parsed = ParseDType(dtype);
  if (!parsed)
    return absl::InvalidArgumentError("--dtype must be bf16 or fp16, got '" + dtype + "'");
  o.dtype = *parsed;
  o.batch = absl::GetFlag(FLAGS_batch);
  o.block_size = absl::GetFlag(FLAGS_block_size);
  o.n_layer = absl::GetFlag(FLAGS_n_layer);
  o.n_embd = absl::GetFlag(FLAGS_n_embd);
  o.n_head = absl::GetFlag(FLAGS_n_head);
  o.steps = absl::GetFlag(FLAGS_steps);
  ZO_ASSIGN_OR_RETURN(o.gemm_size, ParseCount(absl::GetFlag(FLAGS_gemm_size)));
  o.json = absl::GetFlag(FLAGS_json);
  o.step_rows = o.dpu = o.sync = o.largest = false;
  for (absl::string_view row : absl::StrSplit(absl::GetFlag(FLAGS_rows), ',')) {
    if (row == "gemm" || row == "step") {
      o.step_rows = true;
    } else if (row == "dpu") {
      o.dpu = true;
    } else if (row == "sync") {
      o.sync = true;
    } else if (row == "largest") {
      o.largest = true;
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("--rows: '", row, "' is not one of gemm, step, dpu, sync, largest"));
    }
  }
  const std::string largest = absl::GetFlag(FLAGS_largest);
  std::vector<std::string> shape = absl::StrSplit(largest, 'x');
  if (shape.size() != 3 || !absl::SimpleAtoi(shape[0], &o.largest_layers) ||
      !absl::SimpleAtoi(shape[1], &o.largest_width) ||
      !absl::SimpleAtoi(shape[2], &o.largest_heads)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--largest must be LAYERSxWIDTHxHEADS (e.g. 36x3072x24), got '", largest, "'"));
  }
  o.largest_steps = absl::GetFlag(FLAGS_largest_steps);
  o.largest_lr = absl::GetFlag(FLAGS_largest_lr);
  o.largest_warmup_steps = absl::GetFlag(FLAGS_largest_warmup_steps);
  o.largest_gradient_accumulation = absl::GetFlag(FLAGS_largest_gradient_accumulation);
  if (const std::string budget = absl::GetFlag(FLAGS_largest_device_memory_budget);
      !budget.empty()) {
    ZO_ASSIGN_OR_RETURN(o.largest_device_memory_budget,
                        ParseBytes("largest-device-memory-budget", budget));
  }
  o.largest_nvme_dir = absl::GetFlag(FLAGS_largest_nvme);
  if (o.largest_gradient_accumulation != "auto" && o.largest_gradient_accumulation != "device" &&
      o.largest_gradient_accumulation != "servers") {
    return absl::InvalidArgumentError(
        absl::StrCat("--largest-gradient-accumulation must be auto, device or servers, got '",
                     o.largest_gradient_accumulation, "'"));
  }
  return o;
}

int RunGpu() { return RunWorkload("gpu", GpuOptionsFromFlags(), &bench::RunGpuBench); }
#else
int RunGpu() {
  std::cerr << "zo-bench gpu: this build has no CUDA backend (configure with nvcc on the PATH "
               "or -DZO_WITH_CUDA=ON)\n";
  return 2;
}
#endif

absl::StatusOr<bench::StreamBenchOptions> StreamOptionsFromFlags() {
  bench::StreamBenchOptions o;
  o.device = absl::GetFlag(FLAGS_stream_device);
  const std::string dtype = absl::GetFlag(FLAGS_dtype);
  const std::optional<DType> parsed = ParseDType(dtype);
  if (!parsed || *parsed == DType::kFloat32) {
    return absl::InvalidArgumentError("--dtype must be bf16 or fp16, got '" + dtype + "'");
  }
  o.dtype = *parsed;
  const std::string shape = absl::GetFlag(FLAGS_stream_shape);
  const std::vector<std::string> parts = absl::StrSplit(shape, 'x');
  if (parts.size() != 2 || !absl::SimpleAtoi(parts[0], &o.n_layer) ||
      !absl::SimpleAtoi(parts[1], &o.n_embd) || o.n_layer < 1 || o.n_embd < 32 ||
      o.n_embd % 32 != 0) {
    return absl::InvalidArgumentError(
        "--stream-shape wants LAYERSxWIDTH with a width that is a multiple of 32, got '" + shape +
        "'");
  }
  o.n_head = o.n_embd / 32;
  o.steps = 2 * absl::GetFlag(FLAGS_steps);
  const int rounds = absl::GetFlag(FLAGS_rounds);
  o.rounds = rounds == 0 ? 2 : rounds;
  o.window = absl::GetFlag(FLAGS_stream_window);
  o.nvme_dir = absl::GetFlag(FLAGS_stream_nvme);
  o.json = absl::GetFlag(FLAGS_json);
  return o;
}

int RunStream() { return RunWorkload("stream", StreamOptionsFromFlags(), &bench::RunStreamBench); }

// The registry: name -> runner, in the order `zo-bench --help` lists them.
struct Workload {
  const char* name;
  int (*run)();
};
constexpr Workload kWorkloads[] = {
    {"adam", RunAdam},       {"nvme", RunNvme},     {"wire", RunWire},
    {"offload", RunOffload}, {"scale", RunScale},   {"checkpoint", RunCheckpoint},
    {"gpu", RunGpu},         {"stream", RunStream},
};

int Main(int argc, char** argv) {
  std::vector<std::string> storage;
  std::vector<char*> positional = ParseFlags(argc, argv, kUsage, "bench/zo_bench_main", storage);
  if (positional.size() < 2) {
    std::cerr << "zo-bench: name a workload; try zo-bench --help\n";
    return 2;
  }
  std::vector<const Workload*> todo;
  for (size_t i = 1; i < positional.size(); ++i) {
    const Workload* found = nullptr;
    for (const Workload& w : kWorkloads) {
      if (std::string(positional[i]) == w.name) found = &w;
    }
    if (found == nullptr) {
      std::cerr << "zo-bench: unknown workload '" << positional[i] << "'; try zo-bench --help\n";
      return 2;
    }
    todo.push_back(found);
  }
  for (const Workload* w : todo) {
    if (int rc = w->run(); rc != 0) return rc;
  }
  return 0;
}

}  // namespace
}  // namespace zo

int main(int argc, char** argv) { return zo::Main(argc, argv); }
