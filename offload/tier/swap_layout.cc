#include "offload/tier/swap_layout.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace zo {
namespace {

constexpr int64_t kStateBytesPerElem = kStateArrays * sizeof(float);

constexpr size_t RoundUp(size_t n, size_t align) { return (n + align - 1) / align * align; }

int64_t EffectiveSubGroup(int64_t total, int64_t requested) {
  return std::max<int64_t>(1, std::min(total, requested));
}

int64_t RamSubGroups(int64_t total, int64_t sub_group, int64_t groups, int64_t budget) {
  if (budget < 0 || total * kStateBytesPerElem <= budget) return groups;
  // Not everything fits, so the (possibly shorter) last sub-group is out.
  return std::min(budget / (sub_group * kStateBytesPerElem), groups - 1);
}

}  // namespace

const char* StateArrayName(int array) {
  switch (array) {
    case kStateMaster:
      return "master";
    case kStateM:
      return "m";
    case kStateV:
      return "v";
    default:
      return "?";
  }
}

SwapLayout::SwapLayout(int64_t total_elems, int64_t sub_group_elems, int64_t ram_budget_bytes)
    : total_elems_(total_elems),
      sub_group_elems_(EffectiveSubGroup(total_elems, sub_group_elems)),
      num_sub_groups_((total_elems + sub_group_elems_ - 1) / sub_group_elems_),
      ram_sub_groups_(
          RamSubGroups(total_elems, sub_group_elems_, num_sub_groups_, ram_budget_bytes)),
      region_bytes_(
          RoundUp(static_cast<size_t>(sub_group_elems_) * sizeof(float), kSwapAlignBytes)),
      blocks_per_region_(
          static_cast<int64_t>(RoundUp(region_bytes_, kChecksumBlockBytes) / kChecksumBlockBytes)) {
}

int64_t SwapLayout::ram_elems() const {
  return std::min(total_elems_, ram_sub_groups_ * sub_group_elems_);
}

int64_t SwapLayout::size(int64_t sg) const {
  return std::min(sub_group_elems_, total_elems_ - begin(sg));
}

size_t SwapLayout::used_region_bytes(int64_t sg) const {
  return RoundUp(static_cast<size_t>(size(sg)) * sizeof(float), kSwapAlignBytes);
}

size_t SwapLayout::block_bytes(int64_t sg, int64_t tile) const {
  const size_t start = static_cast<size_t>(tile) * kChecksumBlockBytes;
  return std::min(kChecksumBlockBytes, used_region_bytes(sg) - start);
}

std::string SwapLayout::DescribeSubGroup(int64_t sg) const {
  return absl::StrCat("sub-group ", sg, " (elements [", begin(sg), ", ", begin(sg) + size(sg),
                      "))");
}

}  // namespace zo
