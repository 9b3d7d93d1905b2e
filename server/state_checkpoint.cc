#include "server/state_checkpoint.h"

#include "common/status_macros.h"
#include "server/job_internal.h"
#include "server/lr_schedule.h"

namespace zo {

bool SameManifest(const std::vector<TensorSpec>& a, const std::vector<TensorSpec>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].name != b[i].name || a[i].shape != b[i].shape) return false;
  }
  return true;
}

absl::StatusOr<CheckpointPartSummary> WriteStatePart(TieredOptimizerState& state,
                                                     absl::Span<const LocalChunk> chunks,
                                                     const ShardMap& map, const std::string& path) {
  ZO_ASSIGN_OR_RETURN(auto writer, CheckpointPartWriter::Create(path));
  std::vector<float> master, m, v;
  for (const LocalChunk& c : chunks) {
    master.resize(c.elems);
    m.resize(c.elems);
    v.resize(c.elems);
    ZO_RETURN_IF_ERROR(state.ReadState(c.local_offset, absl::MakeSpan(master), absl::MakeSpan(m),
                                       absl::MakeSpan(v)));
    ZO_RETURN_IF_ERROR(writer->AddChunk(c.id, map.ChunkRange(c.id).begin, master, m, v));
  }
  return writer->Finish();
}

absl::Status LoadStatePart(CheckpointReader& reader, absl::Span<const LocalChunk> chunks,
                           const ShardMap& map, TieredOptimizerState& state, void* low_precision,
                           DType dtype, void* previous) {
  std::vector<float> master, m, v;
  char* lp = static_cast<char*>(low_precision);
  char* prev = static_cast<char*>(previous);
  for (const LocalChunk& c : chunks) {
    master.resize(c.elems);
    m.resize(c.elems);
    v.resize(c.elems);
    ZO_RETURN_IF_ERROR(reader.ReadFlat(map.ChunkRange(c.id).begin, absl::MakeSpan(master),
                                       absl::MakeSpan(m), absl::MakeSpan(v)));
    ZO_RETURN_IF_ERROR(state.WriteState(c.local_offset, master, m, v));
    if (lp != nullptr) {
      job_internal::RoundMaster(master.data(), lp + c.local_offset * DTypeSize(dtype),
                                master.size(), dtype);
    }
    if (prev != nullptr) {
      ZO_RETURN_IF_ERROR(reader.ReadPreviousFlat(map.ChunkRange(c.id).begin, c.elems,
                                                 prev + c.local_offset * DTypeSize(dtype)));
    }
  }
  return absl::OkStatus();
}

LastStep LastStepOf(const CheckpointMeta& meta, const Config& config) {
  if (meta.has_last_step) {
    return {.grad_norm = meta.last_grad_norm,
            .lr = meta.last_lr,
            .skipped = meta.last_skipped,
            .derived = false};
  }
  // The newest applied step had applied_steps - 1 before it.
  return {.grad_norm = 0.0,
          .lr = meta.applied_steps > 0 ? LrSchedule::FromConfig(config).LrAt(meta.applied_steps - 1)
                                       : 0.0,
          .skipped = false,
          .derived = true};
}

}  // namespace zo
