// How much RAM the host can still hand out: what a server checks a job's
// allocation against before making it, so that an oversized or hostile
// OpenJob is refused instead of ending in the kernel's OOM killer.
#ifndef ZO_COMMON_HOST_MEMORY_H_
#define ZO_COMMON_HOST_MEMORY_H_

#include <cstdint>
#include <optional>
#include <string>

namespace zo {

// What this process may still allocate, in bytes: MemAvailable from
// /proc/meminfo (free memory plus what the kernel can reclaim without
// swapping), or less where the process's memory cgroup has a limit closer
// (a Kubernetes pod's, a systemd unit's MemoryMax): the OOM killer acts on
// the cgroup's. nullopt where neither can be read.
std::optional<int64_t> AvailableHostMemory();

// The least limit - usage over the process's memory cgroup and its
// ancestors (cgroup v2: memory.max / memory.current; v1:
// memory.limit_in_bytes / memory.usage_in_bytes), usage without the
// inactive page cache the kernel reclaims first; nullopt where none has a
// limit or the files cannot be read.
std::optional<int64_t> CgroupMemoryHeadroom();

// The MemAvailable line of /proc/meminfo-formatted `text`, in bytes.
std::optional<int64_t> ParseMemAvailable(const std::string& text);

// The process's memory cgroup from /proc/self/cgroup-formatted `text`: the
// v2 path ("0::/a/b") and the v1 memory controller's ("4:memory:/a/b"),
// empty where absent.
struct CgroupPaths {
  std::string v2;
  std::string v1_memory;
};
CgroupPaths ParseCgroupPaths(const std::string& text);

}  // namespace zo

#endif  // ZO_COMMON_HOST_MEMORY_H_
