#include "common/host_memory.h"

#include "gtest/gtest.h"

namespace zo {
namespace {

TEST(HostMemoryTest, ParsesMemAvailableInKibibytes) {
  EXPECT_EQ(ParseMemAvailable("MemTotal:       24568732 kB\nMemFree:         1000 kB\n"
                              "MemAvailable:   20000000 kB\nBuffers: 1 kB\n"),
            int64_t{20000000} * 1024);
  EXPECT_EQ(ParseMemAvailable("MemTotal: 5 kB\n"), std::nullopt);
  EXPECT_EQ(ParseMemAvailable("MemAvailable: lots kB\n"), std::nullopt);
  EXPECT_EQ(ParseMemAvailable("MemAvailable: 12\n"), std::nullopt);  // no unit
  EXPECT_EQ(ParseMemAvailable("MemAvailable: 99999999999999999999 kB\n"), std::nullopt);
}

TEST(HostMemoryTest, ParsesTheCgroupPathsOfBothVersions) {
  const CgroupPaths mixed =
      ParseCgroupPaths("9:name=systemd:/\n4:memory:/process_api/abc\n2:cpu,cpuacct:/x\n0::/\n");
  EXPECT_EQ(mixed.v1_memory, "/process_api/abc");
  EXPECT_EQ(mixed.v2, "/");
  const CgroupPaths v2 = ParseCgroupPaths("0::/kubepods/pod1/c2\n");
  EXPECT_EQ(v2.v2, "/kubepods/pod1/c2");
  EXPECT_EQ(v2.v1_memory, "");
  EXPECT_EQ(ParseCgroupPaths("3:memory,hugetlb:/a\n").v1_memory, "/a");
  EXPECT_EQ(ParseCgroupPaths("garbage\n").v2, "");
}

TEST(HostMemoryTest, ThisHostHasSomeAvailable) {
  const std::optional<int64_t> available = AvailableHostMemory();
  ASSERT_TRUE(available.has_value());
  EXPECT_GT(*available, 0);
}

}  // namespace
}  // namespace zo
