// How much RAM the host can still hand out: what a server checks a job's
// allocation against before making it, so that an oversized or hostile
// OpenJob is refused instead of ending in the kernel's OOM killer.
#ifndef ZO_COMMON_HOST_MEMORY_H_
#define ZO_COMMON_HOST_MEMORY_H_

#include <cstdint>
#include <optional>
#include <string>

namespace zo {

// MemAvailable from /proc/meminfo, in bytes (free memory plus what the
// kernel can reclaim without swapping); nullopt where it cannot be read.
std::optional<int64_t> AvailableHostMemory();

// The MemAvailable line of /proc/meminfo-formatted `text`, in bytes.
std::optional<int64_t> ParseMemAvailable(const std::string& text);

}  // namespace zo

#endif  // ZO_COMMON_HOST_MEMORY_H_
