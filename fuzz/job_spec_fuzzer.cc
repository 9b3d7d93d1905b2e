// An OpenJob request (proto/zo/v1/job.proto) as protobuf parses it off the
// wire, then its validation into a JobSpec (server/job_spec.h): name, server
// list, config, manifest, shard map; and the attach rule (JobSpecMismatch)
// against a fixed job and against itself.
//
// Invariants: a valid spec matches itself; the same request with its config
// rewritten by ConfigToJson is valid and matches it too (attach compares
// configs as parsed, not as spelled).
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "common/config.h"
#include "fuzz/fuzz_support.h"
#include "proto/zo/v1/job.pb.h"
#include "server/job_spec.h"

namespace {

const zo::JobSpec* fixed_job = nullptr;

zo::JobSpec FixedJob() {
  zo::v1::OpenJobRequest r;
  r.set_job("gpt");
  zo::v1::TensorSpec* t = r.mutable_manifest()->add_tensors();
  t->set_name("w");
  t->add_shape(10);
  t->add_shape(10);
  t->set_dtype(zo::v1::DTYPE_FP16);
  r.set_config_json(R"({"train_batch_size": 2, "fp16": {"enabled": true}})");
  r.set_dp_world_size(2);
  r.add_servers("127.0.0.1:7070");
  absl::StatusOr<zo::JobSpec> spec = zo::JobSpecFromRequest(r);
  if (!spec.ok()) zo::fuzz::Fail("the fixed job does not validate", spec.status().ToString());
  return *std::move(spec);
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  zo::fuzz::QuietLogs();
  fixed_job = new zo::JobSpec(FixedJob());
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  zo::v1::OpenJobRequest request;
  if (!request.ParseFromArray(data, static_cast<int>(size))) return 0;
  absl::StatusOr<zo::JobSpec> spec = zo::JobSpecFromRequest(request);
  if (!spec.ok()) return 0;
  ZO_FUZZ_CHECK(zo::JobSpecMismatch(*spec, *spec).empty(), "a job differs from itself");
  zo::JobSpecMismatch(*fixed_job, *spec);
  zo::JobSpecMismatch(*spec, *fixed_job);

  request.set_config_json(zo::ConfigToJson(spec->config));
  absl::StatusOr<zo::JobSpec> canonical = zo::JobSpecFromRequest(request);
  ZO_FUZZ_CHECK(canonical.ok(), canonical.status().ToString());
  const std::string diff = zo::JobSpecMismatch(*spec, *canonical);
  ZO_FUZZ_CHECK(diff.empty(), diff);
  return 0;
}
