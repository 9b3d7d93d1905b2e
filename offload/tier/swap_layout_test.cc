#include "offload/tier/swap_layout.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace zo {
namespace {

TEST(SwapLayoutTest, SubGroupsAndBudget) {
  // 10 sub-groups of 1000 and a last one of 3; 12 bytes per element.
  const SwapLayout all(10'003, 1000, -1);
  EXPECT_EQ(all.num_sub_groups(), 11);
  EXPECT_EQ(all.ram_sub_groups(), 11);
  EXPECT_EQ(all.nvme_sub_groups(), 0);
  EXPECT_EQ(all.size(10), 3);
  EXPECT_EQ(all.ram_elems(), 10'003);

  EXPECT_EQ(SwapLayout(10'003, 1000, 0).ram_sub_groups(), 0);
  EXPECT_EQ(SwapLayout(10'003, 1000, 12'000).ram_sub_groups(), 1);
  EXPECT_EQ(SwapLayout(10'003, 1000, 12'000 * 3 + 11'999).ram_sub_groups(), 3);
  // Ten full ones fit, the short last one does not.
  EXPECT_EQ(SwapLayout(10'003, 1000, 120'000).ram_sub_groups(), 10);
  EXPECT_EQ(SwapLayout(10'003, 1000, 120'036).ram_sub_groups(), 11);
  EXPECT_EQ(SwapLayout(10'003, 1000, 120'000).ram_elems(), 10'000);
}

TEST(SwapLayoutTest, SubGroupLargerThanTotalShrinks) {
  const SwapLayout layout(5000, 1'000'000'000, 0);
  EXPECT_EQ(layout.sub_group_elems(), 5000);
  EXPECT_EQ(layout.num_sub_groups(), 1);
  EXPECT_EQ(layout.region_bytes(), 20'480u);  // 20000 rounded up to 4 KiB
}

TEST(SwapLayoutTest, EmptyState) {
  const SwapLayout layout(0, 1000, 0);
  EXPECT_EQ(layout.num_sub_groups(), 0);
  EXPECT_EQ(layout.file_bytes(), 0u);
}

TEST(SwapLayoutTest, RegionsAndBlocksArePaddedTo4KiB) {
  // 40'000 elements: 160'000 bytes -> 163'840 (40 pages), 3 checksum blocks.
  const SwapLayout layout(100'001, 40'000, 0);
  EXPECT_EQ(layout.region_bytes(), 163'840u);
  EXPECT_EQ(layout.slot_bytes(), 3 * 163'840u);
  EXPECT_EQ(layout.blocks_per_region(), 3);
  EXPECT_EQ(layout.tiles(0), 3);
  EXPECT_EQ(layout.block_bytes(0, 0), kChecksumBlockBytes);
  EXPECT_EQ(layout.block_bytes(0, 2), 163'840u - 2 * kChecksumBlockBytes);
  // The last sub-group: 20'001 elements, 80'004 bytes -> 81'920.
  EXPECT_EQ(layout.size(2), 20'001);
  EXPECT_EQ(layout.used_region_bytes(2), 81'920u);
  EXPECT_EQ(layout.tiles(2), 2);
  EXPECT_EQ(layout.block_bytes(2, 1), 81'920u - kChecksumBlockBytes);
  EXPECT_EQ(layout.slot_offset(2), 2 * layout.slot_bytes());
  EXPECT_EQ(layout.region_offset(1, kStateV), layout.slot_bytes() + 2 * 163'840u);
  EXPECT_EQ(layout.file_bytes(), 3 * layout.slot_bytes());
  EXPECT_EQ(layout.DescribeSubGroup(2), "sub-group 2 (elements [80000, 100001))");
}

TEST(SwapLayoutTest, SlotsFollowTheRamSubGroups) {
  const SwapLayout layout(100, 10, 12 * 30);
  EXPECT_EQ(layout.ram_sub_groups(), 3);
  EXPECT_EQ(layout.nvme_sub_groups(), 7);
  EXPECT_EQ(layout.sub_group_of_slot(0), 3);
  EXPECT_EQ(layout.slot_offset(0), 0u);
}

}  // namespace
}  // namespace zo
