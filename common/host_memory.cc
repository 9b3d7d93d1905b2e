#include "common/host_memory.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <sstream>
#include <vector>

#include "absl/algorithm/container.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace zo {

std::optional<int64_t> ParseMemAvailable(const std::string& text) {
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (!absl::ConsumePrefix(&line, "MemAvailable:")) continue;
    line = absl::StripAsciiWhitespace(line);
    if (!absl::ConsumeSuffix(&line, "kB")) return std::nullopt;
    int64_t kib = 0;
    if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(line), &kib) || kib < 0 ||
        kib > std::numeric_limits<int64_t>::max() / 1024) {
      return std::nullopt;
    }
    return kib * 1024;
  }
  return std::nullopt;
}

CgroupPaths ParseCgroupPaths(const std::string& text) {
  CgroupPaths paths;
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
    const std::vector<absl::string_view> f = absl::StrSplit(line, absl::MaxSplits(':', 2));
    if (f.size() != 3) continue;
    if (f[0] == "0" && f[1].empty()) {
      paths.v2 = std::string(f[2]);
    } else if (absl::c_linear_search(absl::StrSplit(f[1], ','), "memory")) {
      paths.v1_memory = std::string(f[2]);
    }
  }
  return paths;
}

namespace {

std::optional<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// A limit or usage file's number; nullopt for "max", an unreadable file, or
// v1's "no limit" (the page counter's maximum, about 2^63).
std::optional<int64_t> ReadBytes(const std::string& path) {
  const std::optional<std::string> text = ReadFile(path);
  int64_t v = 0;
  if (!text.has_value() || !absl::SimpleAtoi(absl::StripAsciiWhitespace(*text), &v) || v < 0 ||
      v >= (int64_t{1} << 62)) {
    return std::nullopt;
  }
  return v;
}

// Field `key` of a memory.stat file; 0 where absent.
int64_t StatField(const std::string& path, absl::string_view key) {
  const std::optional<std::string> text = ReadFile(path);
  if (!text.has_value()) return 0;
  for (absl::string_view line : absl::StrSplit(*text, '\n')) {
    if (!absl::ConsumePrefix(&line, key) || !absl::ConsumePrefix(&line, " ")) continue;
    int64_t v = 0;
    return absl::SimpleAtoi(line, &v) && v > 0 ? v : 0;
  }
  return 0;
}

// The least limit - usage from `dir` up to `root` (the hierarchy's mount).
// Usage counts the page cache, which the kernel reclaims before it kills:
// the inactive file pages (`inactive_stat` of memory.stat) are left out, as
// a kubelet's working set does.
std::optional<int64_t> HeadroomUpTo(std::filesystem::path dir, const std::filesystem::path& root,
                                    const char* limit_file, const char* usage_file,
                                    absl::string_view inactive_stat) {
  std::optional<int64_t> least;
  for (;;) {
    const std::optional<int64_t> limit = ReadBytes((dir / limit_file).string());
    const std::optional<int64_t> usage = ReadBytes((dir / usage_file).string());
    if (limit.has_value() && usage.has_value()) {
      const int64_t working =
          std::max<int64_t>(0, *usage - StatField((dir / "memory.stat").string(), inactive_stat));
      const int64_t headroom = std::max<int64_t>(0, *limit - working);
      least = least.has_value() ? std::min(*least, headroom) : headroom;
    }
    if (dir == root || !dir.has_parent_path() || dir.parent_path() == dir) break;
    dir = dir.parent_path();
  }
  return least;
}

// `path` of /proc/self/cgroup under the hierarchy mounted at `root`; in a
// container whose cgroup namespace hides the host's path, the mount itself.
std::filesystem::path CgroupDir(const std::filesystem::path& root, const std::string& path) {
  std::error_code ec;
  const std::filesystem::path full = root / std::filesystem::path(path).relative_path();
  return std::filesystem::is_directory(full, ec) ? full : root;
}

}  // namespace

std::optional<int64_t> CgroupMemoryHeadroom() {
  const std::optional<std::string> self = ReadFile("/proc/self/cgroup");
  if (!self.has_value()) return std::nullopt;
  const CgroupPaths paths = ParseCgroupPaths(*self);
  std::error_code ec;
  std::optional<int64_t> least;
  const auto take = [&](std::optional<int64_t> h) {
    if (h.has_value()) least = least.has_value() ? std::min(*least, *h) : *h;
  };
  if (!paths.v2.empty()) {
    for (const char* mount : {"/sys/fs/cgroup", "/sys/fs/cgroup/unified"}) {
      if (!std::filesystem::exists(std::filesystem::path(mount) / "cgroup.controllers", ec)) {
        continue;
      }
      take(HeadroomUpTo(CgroupDir(mount, paths.v2), mount, "memory.max", "memory.current",
                        "inactive_file"));
      break;
    }
  }
  if (!paths.v1_memory.empty()) {
    const std::filesystem::path mount = "/sys/fs/cgroup/memory";
    take(HeadroomUpTo(CgroupDir(mount, paths.v1_memory), mount, "memory.limit_in_bytes",
                      "memory.usage_in_bytes", "total_inactive_file"));
  }
  return least;
}

std::optional<int64_t> AvailableHostMemory() {
  const std::optional<std::string> meminfo = ReadFile("/proc/meminfo");
  std::optional<int64_t> available =
      meminfo.has_value() ? ParseMemAvailable(*meminfo) : std::nullopt;
  if (const std::optional<int64_t> cgroup = CgroupMemoryHeadroom(); cgroup.has_value()) {
    available = available.has_value() ? std::min(*available, *cgroup) : *cgroup;
  }
  return available;
}

}  // namespace zo
