#include "server/compensation_record.h"

#include <algorithm>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"

namespace zo {
namespace {

// Enough for a worker one step behind the servers, and the step before it.
constexpr size_t kKept = 4;

// Eight independent sums, so that the adds pipeline (one chain would take
// an add's latency per element: 20 ms a step on 32 Mi elements and 2 cores).
double SumOf(const float* v, int64_t n) {
  double acc[8] = {};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int k = 0; k < 8; ++k) acc[k] += v[i + k];
  }
  for (; i < n; ++i) acc[0] += v[i];
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

template <typename Map>
void KeepLast(Map& m) {
  while (m.size() > kKept) m.erase(m.begin());
}

}  // namespace

CompensationRecord::CompensationRecord(std::vector<Part> parts)
    : parts_(std::move(parts)), tile_sums_(parts_.size()) {}

void CompensationRecord::Decided(int64_t step, bool skipped, double grad_multiplier,
                                 int64_t applied_steps, std::vector<double> group_lr) {
  {
    std::lock_guard lock(mu_);
    decisions_[step] = {skipped, grad_multiplier, applied_steps, std::move(group_lr)};
    KeepLast(decisions_);
  }
  decided_cv_.notify_all();
}

void CompensationRecord::AddTile(int64_t offset, int64_t n, const float* v) {
  // Parts are ascending and disjoint: those that meet [offset, offset + n).
  auto it = std::upper_bound(parts_.begin(), parts_.end(), offset,
                             [](int64_t o, const Part& p) { return o < p.begin + p.length; });
  for (; it != parts_.end() && it->begin < offset + n; ++it) {
    const int64_t b = std::max(offset, it->begin);
    const int64_t e = std::min(offset + n, it->begin + it->length);
    const double sum = SumOf(v + (b - offset), e - b);
    std::lock_guard lock(tiles_mu_);
    tile_sums_[static_cast<size_t>(it - parts_.begin())].emplace_back(offset, sum);
  }
}

void CompensationRecord::UpdateEnded(int64_t step, bool made, bool skipped) {
  std::vector<std::vector<std::pair<int64_t, double>>> tiles(parts_.size());
  {
    std::lock_guard lock(tiles_mu_);
    std::swap(tiles, tile_sums_);
  }
  std::lock_guard lock(mu_);
  if (!made) return;
  if (skipped) {
    if (auto it = v_sums_.find(step - 1); it != v_sums_.end()) v_sums_[step] = it->second;
  } else {
    std::vector<double> sums(parts_.size(), 0.0);
    for (size_t p = 0; p < tiles.size(); ++p) {
      std::sort(tiles[p].begin(), tiles[p].end());
      for (const auto& [offset, sum] : tiles[p]) sums[p] += sum;
    }
    v_sums_[step] = std::move(sums);
  }
  KeepLast(v_sums_);
}

void CompensationRecord::Forget(int64_t restored_version) {
  {
    std::lock_guard lock(tiles_mu_);
    for (auto& t : tile_sums_) t.clear();
  }
  {
    std::lock_guard lock(mu_);
    decisions_.clear();
    v_sums_.clear();
    restored_version_ = restored_version;
  }
  decided_cv_.notify_all();  // a call waiting for a step before it has its answer
}

void CompensationRecord::Stop(absl::Status reason) {
  {
    std::lock_guard lock(mu_);
    if (stopped_.ok()) stopped_ = std::move(reason);
  }
  decided_cv_.notify_all();
}

absl::StatusOr<std::vector<CompensationTerms>> CompensationRecord::Await(int64_t step,
                                                                         absl::Time deadline) {
  std::unique_lock lock(mu_);
  const auto restored_over = [&] {
    return step <= restored_version_ && !decisions_.contains(step);
  };
  const bool decided = decided_cv_.wait_until(lock, absl::ToChronoTime(deadline), [&] {
    return !stopped_.ok() || decisions_.contains(step) || restored_over();
  });
  if (!stopped_.ok()) return stopped_;
  if (!decided) {
    return absl::DeadlineExceededError(
        absl::StrCat("step ", step, " was not decided within the call's deadline"));
  }
  if (restored_over()) {
    // Decided before the checkpoint was written, and not kept in it: the
    // worker computes on the version it pulled.
    std::vector<CompensationTerms> terms;
    for (const Part& part : parts_) {
      terms.push_back(TermsFor(part.hp, CompensatedStep{.skipped = true}, part.tensor, 0, 0.0));
    }
    return terms;
  }
  const Decision& d = decisions_.at(step);
  const auto before = decisions_.find(step - 1);
  const auto v = v_sums_.find(step - 1);
  std::vector<CompensationTerms> terms;
  terms.reserve(parts_.size());
  for (size_t i = 0; i < parts_.size(); ++i) {
    const Part& part = parts_[i];
    const auto group = static_cast<size_t>(part.group);
    CompensatedStep s;
    s.skipped = d.skipped;
    s.grad_multiplier = d.grad_multiplier;
    s.lr = d.group_lr[group];
    s.applied_before = d.skipped ? d.applied_steps : d.applied_steps - 1;
    if (before != decisions_.end() && !before->second.skipped) {
      s.previous_lr = before->second.group_lr[group];
    }
    // v unknown (restored since): no gradient part.
    const bool known = v != v_sums_.end();
    terms.push_back(
        TermsFor(part.hp, s, part.tensor, known ? part.length : 0, known ? v->second[i] : 0.0));
  }
  return terms;
}

}  // namespace zo
