// Writes the binary seeds of fuzz/corpus/ (and the checkpoint.json that
// matches the reference parts), so that each can be made again after a
// format change: `build/fuzz/fuzz/make_seeds fuzz/corpus`. The JSON seeds
// that are plain files (configs, manifests) are kept by hand.
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "fuzz/fuzz_support.h"
#include "offload/checkpoint/checkpoint_dir.h"
#include "proto/zo/v1/gradients.pb.h"
#include "proto/zo/v1/job.pb.h"
#include "proto/zo/v1/params.pb.h"
#include "worker/pipeline/internal/tcp_wire.h"

namespace {

namespace fs = std::filesystem;
namespace pi = zo::pipeline::pipeline_internal;

std::string root;

void Seed(const std::string& target, const std::string& name, const std::string& bytes) {
  const std::string dir = absl::StrCat(root, "/", target);
  fs::create_directories(dir);
  zo::fuzz::WriteFileOrDie(absl::StrCat(dir, "/", name), bytes);
}

std::string Bytes(const google::protobuf::Message& m) { return m.SerializeAsString(); }

zo::v1::GradientPiece Piece(int64_t chunk, int64_t offset, int elems, zo::v1::DType dtype) {
  zo::v1::GradientPiece p;
  p.set_job("job");
  p.set_step(1);
  p.set_chunk(chunk);
  p.set_offset(offset);
  p.set_dtype(dtype);
  std::string data(static_cast<size_t>(elems) * (dtype == zo::v1::DTYPE_FP32 ? 4 : 2), '\0');
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>(i % 2 == 0 ? 0x00 : 0x3c);
  p.set_data(data);
  return p;
}

void GradientPieces() {
  auto with = [](uint8_t cut, uint8_t cfg, const zo::v1::GradientPiece& p) {
    return std::string{static_cast<char>(cut), static_cast<char>(cfg)} + Bytes(p);
  };
  Seed("gradient_piece_fuzzer", "fp16_one_slice", with(0, 0, Piece(0, 10, 20, zo::v1::DTYPE_FP16)));
  zo::v1::GradientPiece resend = Piece(1, 0, 37, zo::v1::DTYPE_BF16);
  resend.set_resend(true);
  resend.set_incarnation(0x1234567890abcdefULL);
  Seed("gradient_piece_fuzzer", "bf16_sliced_by_7_two_ranks", with(7, 1 | 2 << 1, resend));
  Seed("gradient_piece_fuzzer", "fp32_sliced_by_3",
       with(3, 6 << 1, Piece(0, 90, 10, zo::v1::DTYPE_FP32)));
  zo::v1::GradientPiece in_region = Piece(0, 10, 20, zo::v1::DTYPE_FP16);
  in_region.clear_data();
  in_region.set_region(0x5eed5eed5eed5eedULL);
  in_region.set_region_offset(64);
  in_region.set_region_bytes(40);
  Seed("gradient_piece_fuzzer", "fp16_in_a_shared_region", with(0, 0, in_region));
  in_region.set_region_ack_offset(8);  // the slot, then the piece's bytes from 64
  in_region.set_region_ack(5);
  Seed("gradient_piece_fuzzer", "fp16_acknowledged_in_a_shared_region", with(0, 0, in_region));
  for (int k = 1; k <= 3; ++k) {  // three more pieces in the same message
    zo::v1::RegionRange* r = in_region.add_more_ranges();
    r->set_chunk(k % 2);
    r->set_offset(20 * k);
    r->set_region_offset(64 + 40 * k);
    r->set_region_bytes(40);
    r->set_region_ack_offset(8);
    r->set_region_ack(5 + k);
  }
  Seed("gradient_piece_fuzzer", "fp16_four_pieces_in_one_region_message", with(5, 0, in_region));
  in_region.set_region_lent(true);
  Seed("gradient_piece_fuzzer", "fp16_four_lent_pieces_in_one_region_message",
       with(5, 0, in_region));
}

void OpenJob() {
  zo::v1::OpenJobRequest r;
  r.set_job("gpt2-small");
  const std::vector<std::pair<std::string, std::vector<int64_t>>> tensors = {
      {"wte", {65, 64}}, {"h.0.attn.w", {64, 192}}, {"ln_f.bias", {64}}, {"scale", {}}};
  for (const auto& [name, shape] : tensors) {
    zo::v1::TensorSpec* t = r.mutable_manifest()->add_tensors();
    t->set_name(name);
    for (int64_t d : shape) t->add_shape(d);
    t->set_dtype(zo::v1::DTYPE_FP16);
  }
  r.set_config_json(zo::fuzz::ReadFileOrDie(
      absl::StrCat(ZO_SOURCE_DIR, "/examples/configs/fp16_static_scale_servers.json")));
  r.set_dp_world_size(1);
  r.add_servers("10.0.0.5:7070");
  r.add_servers("10.0.0.6:7070");
  r.set_server_index(1);
  Seed("job_spec_fuzzer", "two_servers_fp16", Bytes(r));
  r.set_config_json(R"({"train_batch_size": 4, "bf16": {"enabled": true},
    "optimizer": {"type": "AdamW", "params": {"lr": 0.001, "weight_decay": 0.1}},
    "zo": {"chunk_elems": 1024}})");
  for (auto& t : *r.mutable_manifest()->mutable_tensors()) t.set_dtype(zo::v1::DTYPE_BF16);
  r.set_dp_world_size(2);
  Seed("job_spec_fuzzer", "bf16_adamw_dp2", Bytes(r));
}

// Records of job_requests_fuzzer.cc: [kind][u16 length][message].
std::string Record(int kind, const google::protobuf::Message& m) {
  const std::string b = Bytes(m);
  return std::string{static_cast<char>(kind), static_cast<char>(b.size() & 0xff),
                     static_cast<char>(b.size() >> 8)} +
         b;
}

void JobRequests() {
  zo::v1::ParamInitPiece init;
  init.set_job("job");
  init.set_chunk(1);
  init.set_offset(3);
  init.set_data(std::string(4 * 8, '\x3f'));
  zo::v1::PullParamsRequest pull;
  pull.set_job("job");
  pull.set_version(0);
  pull.add_tensors(1);
  pull.set_have_version(-1);
  std::string step = Record(1, init) + Record(0, pull);
  // Every element of both chunks (64 and 73), then a pull of the step's version.
  step += Record(2, Piece(0, 0, 64, zo::v1::DTYPE_FP16));
  step += Record(2, Piece(1, 0, 40, zo::v1::DTYPE_FP16));
  step += Record(2, Piece(1, 40, 33, zo::v1::DTYPE_FP16));
  pull.clear_tensors();
  pull.set_version(1);
  step += Record(0, pull);
  Seed("job_requests_fuzzer", "init_pull_step", step);
  Seed("job_requests_fuzzer", "pull_all", Record(0, pull));
  pull.set_stripe(1);
  pull.set_stripes(2);
  Seed("job_requests_fuzzer", "pull_stripe", Record(0, pull));
}

void Checkpoint() {
  const std::string tmp_root = zo::fuzz::ScratchDir();
  for (const bool with_previous : {false, true}) {
    const int64_t version = with_previous ? 4 : 3;
    absl::StatusOr<std::string> tmp = zo::BeginCheckpoint(tmp_root, "ref", version);
    if (!tmp.ok()) zo::fuzz::Fail("BeginCheckpoint", tmp.status().ToString());
    zo::CheckpointMeta meta = zo::fuzz::WriteReferenceParts(*tmp, with_previous);
    if (with_previous) {
      meta.version = version;
      meta.previous_version = version - 1;
      // A step whose rates and group settings came from the worker.
      meta.has_last_step = true;
      meta.last_grad_norm = 0.5;
      meta.last_lr = 1e-3;
      meta.last_group_lr = {1e-3};
      meta.last_group_hyper = {{.betas = {0.85, 0.99}, .eps = 1e-6, .weight_decay = 0.1}};
    }
    absl::StatusOr<std::string> dir = zo::CommitCheckpoint(*tmp, meta);
    if (!dir.ok()) zo::fuzz::Fail("CommitCheckpoint", dir.status().ToString());
    const std::string suffix = with_previous ? "_with_previous" : "";
    const std::string json = zo::fuzz::ReadFileOrDie(*dir + "/checkpoint.json");
    Seed("checkpoint_meta_fuzzer", absl::StrCat("reference_checkpoint", suffix, ".json"), json);
    if (!with_previous) Seed("safetensors_export_fuzzer", "reference_checkpoint.json", json);
    for (int server = 0; server < 2; ++server) {
      // Without the zero padding of the header (checkpoint_part_fuzzer.cc).
      const std::string part =
          zo::fuzz::ReadFileOrDie(absl::StrCat(*dir, "/", zo::CheckpointPartFileName(server)));
      Seed("checkpoint_part_fuzzer", absl::StrCat("part", server, suffix),
           part.substr(0, 16) + part.substr(4096));
    }
  }
}

void TcpFrames() {
  const std::string hello = pi::EncodeHello(
      {.stages = 4, .stage = 1, .job = "demo", .host = "", .sharing = "", .link = ""});
  auto frame = [&](pi::FrameHeader h, std::string limit) {
    std::string f(pi::kFrameHeaderBytes, '\0');
    pi::EncodeFrameHeader(h, reinterpret_cast<std::byte*>(f.data()));
    return hello.substr(0, pi::kHelloFixedBytes) + f + limit;
  };
  pi::FrameHeader act;
  act.tag = {.kind = zo::pipeline::MessageTag::Kind::kActivation, .step = 7, .micro_batch = 2};
  act.dtype = zo::DType::kFloat16;
  act.shape = {2, 3, 4};
  act.payload_bytes = 2 * 3 * 4 * 2;
  Seed("tcp_frame_fuzzer", "activation_fp16", frame(act, ""));
  pi::FrameHeader grad;
  grad.tag = {
      .kind = zo::pipeline::MessageTag::Kind::kGrad, .step = 1, .micro_batch = 0, .chunk = 1};
  grad.dtype = zo::DType::kFloat32;
  grad.shape = {8, 0, 5};
  grad.payload_bytes = 0;
  Seed("tcp_frame_fuzzer", "grad_empty_limit_4k", frame(grad, std::string("\x00\x10\x00\x00", 4)));
  act.slot = 3;  // the tensor sits in the receiver's inbox slot 3
  Seed("tcp_frame_fuzzer", "activation_in_slot", frame(act, ""));
  Seed("tcp_frame_fuzzer", "credit", frame(pi::Credit(3), ""));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s CORPUS_DIR (fuzz/corpus)\n", argv[0]);
    return 2;
  }
  root = argv[1];
  GradientPieces();
  OpenJob();
  JobRequests();
  Checkpoint();
  TcpFrames();
  std::printf("seeds written under %s\n", root.c_str());
  return 0;
}
