#include "bench/file_location.h"

#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "offload/io/io_error.h"

namespace zo::bench {
namespace {

bool IsOctal(char c) { return c >= '0' && c <= '7'; }

// mountinfo writes space, tab, newline and backslash as \ooo.
std::string Unescape(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\\' && i + 3 < s.size() && IsOctal(s[i + 1]) && IsOctal(s[i + 2]) &&
        IsOctal(s[i + 3])) {
      out.push_back(
          static_cast<char>((s[i + 1] - '0') * 64 + (s[i + 2] - '0') * 8 + (s[i + 3] - '0')));
      i += 3;
    } else {
      out.push_back(s[i]);
    }
  }
  return out;
}

bool UnderMountPoint(const std::string& path, const std::string& mount_point) {
  if (mount_point == "/") return !path.empty() && path[0] == '/';
  return path.compare(0, mount_point.size(), mount_point) == 0 &&
         (path.size() == mount_point.size() || path[mount_point.size()] == '/');
}

std::string ReadFileOrEmpty(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace

std::string FileLocation::ToString() const {
  std::string where = source;
  if (!block_device.empty() && source != "/dev/" + block_device) {
    absl::StrAppend(&where, " [", block_device, "]");
  }
  return absl::StrCat(where, " (", fs_type, " at ", mount_point, ", dev ", dev_major, ":",
                      dev_minor, ")");
}

std::optional<FileLocation> FindMount(const std::string& mountinfo, unsigned dev_major,
                                      unsigned dev_minor, const std::string& path) {
  std::optional<FileLocation> best;
  bool best_matches_dev = false;
  for (absl::string_view line : absl::StrSplit(mountinfo, '\n', absl::SkipEmpty())) {
    // id parent major:minor root mount_point options [optional...] - type source super
    const std::vector<std::string> f = absl::StrSplit(line, ' ', absl::SkipEmpty());
    size_t dash = 6;
    while (dash < f.size() && f[dash] != "-") ++dash;
    if (f.size() < 6 || dash + 2 >= f.size()) continue;
    unsigned major = 0, minor = 0;
    if (std::sscanf(f[2].c_str(), "%u:%u", &major, &minor) != 2) continue;
    FileLocation loc;
    loc.dev_major = major;
    loc.dev_minor = minor;
    loc.mount_point = Unescape(f[4]);
    loc.fs_type = f[dash + 1];
    loc.source = Unescape(f[dash + 2]);
    if (!UnderMountPoint(path, loc.mount_point)) continue;
    const bool matches_dev = major == dev_major && minor == dev_minor;
    // A matching device beats any other; then the deepest mount point; on a
    // tie the later line (a mount over an earlier one hides it).
    if (!best || (matches_dev && !best_matches_dev) ||
        (matches_dev == best_matches_dev && loc.mount_point.size() >= best->mount_point.size())) {
      best = loc;
      best_matches_dev = matches_dev;
    }
  }
  if (best) {
    best->dev_major = dev_major;
    best->dev_minor = dev_minor;
  }
  return best;
}

absl::StatusOr<FileLocation> LocateFile(const std::string& path) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0) return ZO_ERRNO_STATUS(errno, "stat " + path);
  char resolved[PATH_MAX];
  if (realpath(path.c_str(), resolved) == nullptr) {
    return ZO_ERRNO_STATUS(errno, "realpath " + path);
  }
  const unsigned major = ::major(st.st_dev), minor = ::minor(st.st_dev);
  std::optional<FileLocation> loc =
      FindMount(ReadFileOrEmpty("/proc/self/mountinfo"), major, minor, resolved);
  if (!loc) {
    loc = FileLocation{major, minor, "?", "?", "?", ""};
  }
  char link[PATH_MAX];
  const std::string sys = absl::StrCat("/sys/dev/block/", major, ":", minor);
  if (const ssize_t n = readlink(sys.c_str(), link, sizeof(link) - 1); n > 0) {
    const std::string target(link, static_cast<size_t>(n));
    loc->block_device = target.substr(target.rfind('/') + 1);
  }
  return *loc;
}

}  // namespace zo::bench
