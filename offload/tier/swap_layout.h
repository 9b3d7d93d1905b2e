// Where each sub-group of the tiered optimizer state lives: the first ones in
// RAM (as many as the budget holds), the rest in one swap file, one fixed-size
// slot each. A slot holds master, m and v as three contiguous regions, each
// 4 KiB-aligned (O_DIRECT); checksums cover 64 KiB blocks of each region, and
// the update walks the same blocks as "tiles" of 16 Ki elements. See
// offload/tier/design.md for the picture.
//
//   SwapLayout layout(total_elems, /*sub_group_elems=*/1 << 24, /*ram_budget_bytes=*/8ll << 30);
//   uint64_t at = layout.region_offset(slot, kStateM) + tile * kChecksumBlockBytes;
#ifndef ZO_OFFLOAD_TIER_SWAP_LAYOUT_H_
#define ZO_OFFLOAD_TIER_SWAP_LAYOUT_H_

#include <cstddef>
#include <cstdint>
#include <string>

namespace zo {

inline constexpr size_t kSwapAlignBytes = 4096;          // O_DIRECT offsets and lengths
inline constexpr size_t kChecksumBlockBytes = 64 << 10;  // one XXH3-64 per block
// Elements per tile: one checksum block of each array. Tiles are the unit of
// the threaded update in RAM and on NVMe alike, so both make the same kernel
// calls and produce the same bits.
inline constexpr int64_t kTileElems = kChecksumBlockBytes / sizeof(float);

// The three fp32 arrays of the state, in slot order.
inline constexpr int kStateArrays = 3;
inline constexpr int kStateMaster = 0;
inline constexpr int kStateM = 1;
inline constexpr int kStateV = 2;
const char* StateArrayName(int array);  // "master", "m", "v"

// Immutable after construction; thread-safe. Sub-group `sg` holds elements
// [begin(sg), begin(sg) + size(sg)); NVMe slot `slot` holds sub-group
// ram_sub_groups() + slot.
class SwapLayout {
 public:
  // `sub_group_elems` > 0 (clamped to total_elems); ram_budget_bytes < 0: all
  // in RAM. A sub-group is in RAM when it and all before it fit the budget
  // (12 bytes per element).
  SwapLayout(int64_t total_elems, int64_t sub_group_elems, int64_t ram_budget_bytes);

  int64_t total_elems() const { return total_elems_; }
  int64_t sub_group_elems() const { return sub_group_elems_; }
  int64_t num_sub_groups() const { return num_sub_groups_; }
  int64_t ram_sub_groups() const { return ram_sub_groups_; }
  int64_t nvme_sub_groups() const { return num_sub_groups_ - ram_sub_groups_; }
  int64_t ram_elems() const;  // elements of the RAM sub-groups together

  int64_t begin(int64_t sg) const { return sg * sub_group_elems_; }
  int64_t size(int64_t sg) const;
  int64_t tiles(int64_t sg) const { return (size(sg) + kTileElems - 1) / kTileElems; }
  int64_t sub_group_of_slot(int64_t slot) const { return ram_sub_groups_ + slot; }

  // Bytes of each region: a full sub-group's array rounded up to 4 KiB, the
  // same for every slot (the last, shorter sub-group is padded).
  size_t region_bytes() const { return region_bytes_; }
  size_t slot_bytes() const { return kStateArrays * region_bytes_; }
  uint64_t file_bytes() const { return static_cast<uint64_t>(nvme_sub_groups()) * slot_bytes(); }
  uint64_t slot_offset(int64_t slot) const { return static_cast<uint64_t>(slot) * slot_bytes(); }
  uint64_t region_offset(int64_t slot, int array) const {
    return slot_offset(slot) + static_cast<uint64_t>(array) * region_bytes_;
  }

  // Bytes of a region that hold data: size(sg) * 4 rounded up to 4 KiB. The
  // rest of the region is zero padding that no checksum covers.
  size_t used_region_bytes(int64_t sg) const;
  // Bytes of checksum block `tile` of a region of `sg` (64 KiB but for the
  // last, which ends at used_region_bytes and includes its zero padding).
  size_t block_bytes(int64_t sg, int64_t tile) const;
  // Checksum blocks per region of a full sub-group: the stride of the table.
  int64_t blocks_per_region() const { return blocks_per_region_; }

  // "sub-group 5 (elements [80, 96))".
  std::string DescribeSubGroup(int64_t sg) const;

 private:
  const int64_t total_elems_;
  const int64_t sub_group_elems_;
  const int64_t num_sub_groups_;
  const int64_t ram_sub_groups_;
  const size_t region_bytes_;
  const int64_t blocks_per_region_;
};

}  // namespace zo

#endif  // ZO_OFFLOAD_TIER_SWAP_LAYOUT_H_
