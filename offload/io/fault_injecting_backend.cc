#include "offload/io/fault_injecting_backend.h"

#include <algorithm>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "offload/io/block_io_engine.h"

namespace zo {

IoFault IoFault::FailRequest(uint64_t request_index, int error) {
  IoFault f;
  f.request_index = request_index;
  f.error = error;
  return f;
}

IoFault IoFault::FailRange(uint64_t begin, uint64_t end, int error, std::optional<IoOp> op) {
  IoFault f;
  f.offset_begin = begin;
  f.offset_end = end;
  f.error = error;
  f.op = op;
  return f;
}

IoFault IoFault::FailRandomly(double probability, int error) {
  IoFault f;
  f.probability = probability;
  f.error = error;
  return f;
}

IoFault IoFault::ShortPiece(uint64_t piece_index, size_t short_bytes) {
  IoFault f;
  f.action = Action::kShort;
  f.piece_index = piece_index;
  f.short_bytes = short_bytes;
  f.times = 1;
  return f;
}

IoFault IoFault::DelayPiece(uint64_t piece_index, int delay) {
  IoFault f;
  f.action = Action::kDelay;
  f.piece_index = piece_index;
  f.delay = delay;
  f.times = 1;
  return f;
}

IoFault IoFault::Slow(absl::Duration latency, std::optional<IoOp> op) {
  IoFault f;
  f.action = Action::kSlow;
  f.latency = latency;
  f.op = op;
  return f;
}

FaultInjectingBackend::FaultInjectingBackend(std::unique_ptr<IoBackend> inner, FaultPlan plan)
    : inner_(std::move(inner)),
      plan_(std::move(plan)),
      name_(absl::StrCat("faulty(", std::string(inner_->name()), ")")),
      fired_(plan_.faults.size(), 0),
      rng_state_(plan_.seed) {}

// splitmix64: tiny, seeded, the same on every platform.
uint64_t FaultInjectingBackend::NextRandom() {
  uint64_t z = (rng_state_ += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

static size_t ShortLength(const IoFault& f, const IoPiece& p) {
  if (f.short_bytes != 0) return f.short_bytes;
  return p.len / 2 / 4096 * 4096;
}

const IoFault* FaultInjectingBackend::Match(const IoPiece& p) {
  for (size_t i = 0; i < plan_.faults.size(); ++i) {
    const IoFault& f = plan_.faults[i];
    if (f.times >= 0 && fired_[i] >= f.times) continue;
    if (f.op.has_value() && *f.op != p.op) continue;
    if (f.fd.has_value() && *f.fd != p.fd) continue;
    if (f.request_index.has_value() && *f.request_index != p.request_index) continue;
    if (f.piece_index.has_value() && *f.piece_index != p.piece_index) continue;
    if (p.offset >= f.offset_end || p.offset + p.len <= f.offset_begin) continue;
    if (f.action == IoFault::Action::kShort) {
      const size_t n = ShortLength(f, p);
      if (n == 0 || n >= p.len) continue;  // nothing to cut
    }
    if (f.probability < 1.0) {
      const double draw = static_cast<double>(NextRandom() >> 11) * 0x1.0p-53;
      if (draw >= f.probability) continue;
    }
    ++fired_[i];
    ++injected_;
    return &f;
  }
  return nullptr;
}

void FaultInjectingBackend::Submit(absl::Span<const IoPiece> pieces) {
  std::vector<IoPiece> pass;
  pass.reserve(pieces.size());
  for (const IoPiece& p : pieces) {
    const IoFault* f = Match(p);
    if (f == nullptr) {
      pass.push_back(p);
      continue;
    }
    switch (f->action) {
      case IoFault::Action::kFail:
        ready_.push_back({p.id, -static_cast<int64_t>(f->error)});
        break;
      case IoFault::Action::kShort: {
        IoPiece cut = p;
        cut.len = ShortLength(*f, p);
        pass.push_back(cut);
        break;
      }
      case IoFault::Action::kDelay:
        delay_ids_.emplace_back(p.id, f->delay);
        pass.push_back(p);
        break;
      case IoFault::Action::kSlow:
        slow_ids_.emplace_back(p.id, absl::Now() + f->latency);
        pass.push_back(p);
        break;
    }
  }
  inner_in_flight_ += pass.size();
  if (!pass.empty()) inner_->Submit(pass);
}

void FaultInjectingBackend::Deliver(const IoPieceResult& result, std::vector<IoPieceResult>* out) {
  auto it = std::find_if(delay_ids_.begin(), delay_ids_.end(),
                         [&](const auto& d) { return d.first == result.id; });
  if (it != delay_ids_.end()) {
    held_.push_back({result, it->second});
    delay_ids_.erase(it);
    return;
  }
  auto slow = std::find_if(slow_ids_.begin(), slow_ids_.end(),
                           [&](const auto& d) { return d.first == result.id; });
  if (slow != slow_ids_.end()) {
    const absl::Time due = slow->second;
    slow_ids_.erase(slow);
    if (absl::Now() < due) {
      slowed_.push_back({result, due});
      return;
    }
  }
  Pass(result, out);
}

void FaultInjectingBackend::Pass(const IoPieceResult& result, std::vector<IoPieceResult>* out) {
  out->push_back(result);
  for (Held& h : held_) --h.remaining;
  auto due = std::stable_partition(held_.begin(), held_.end(),
                                   [](const Held& h) { return h.remaining > 0; });
  for (auto h = due; h != held_.end(); ++h) out->push_back(h->result);
  held_.erase(due, held_.end());
}

void FaultInjectingBackend::PassDue(std::vector<IoPieceResult>* out) {
  const absl::Time now = absl::Now();
  auto waiting = std::stable_partition(slowed_.begin(), slowed_.end(),
                                       [&](const Slowed& s) { return s.due > now; });
  std::vector<Slowed> due(waiting, slowed_.end());
  slowed_.erase(waiting, slowed_.end());
  for (const Slowed& s : due) Pass(s.result, out);
}

absl::Status FaultInjectingBackend::Wait(size_t min_results, std::vector<IoPieceResult>* out) {
  std::vector<IoPieceResult> batch;
  std::vector<IoPieceResult> inner;
  for (const IoPieceResult& r : std::exchange(ready_, {})) Deliver(r, &batch);
  if (inner_in_flight_ > 0) {
    ZO_RETURN_IF_ERROR(inner_->Wait(0, &inner));
  }
  for (;;) {
    inner_in_flight_ -= inner.size();
    for (const IoPieceResult& r : inner) Deliver(r, &batch);
    inner.clear();
    PassDue(&batch);
    if (batch.size() >= min_results) break;
    if (inner_in_flight_ > 0) {
      ZO_RETURN_IF_ERROR(inner_->Wait(1, &inner));
    } else if (!slowed_.empty()) {
      absl::Time first = slowed_.front().due;
      for (const Slowed& s : slowed_) first = std::min(first, s.due);
      absl::SleepFor(first - absl::Now());
    } else if (!held_.empty()) {
      // Nothing else will come: let the oldest held result go.
      batch.push_back(held_.front().result);
      held_.erase(held_.begin());
    } else {
      return absl::InternalError(
          absl::StrCat(name_, ": waiting for ", min_results, " results with nothing in flight"));
    }
  }
  if (plan_.reorder) {
    for (size_t i = batch.size(); i > 1; --i) std::swap(batch[i - 1], batch[NextRandom() % i]);
  }
  out->insert(out->end(), batch.begin(), batch.end());
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<IoEngine>> CreateFaultInjectingEngine(
    const IoEngineOptions& options, std::unique_ptr<IoBackend> inner, FaultPlan plan,
    FaultInjectingBackend** backend) {
  if (inner == nullptr) return absl::InvalidArgumentError("CreateFaultInjectingEngine: null inner");
  auto faulty = std::make_unique<FaultInjectingBackend>(std::move(inner), std::move(plan));
  if (backend != nullptr) *backend = faulty.get();
  return NewBlockIoEngine(options, std::move(faulty));
}

}  // namespace zo
