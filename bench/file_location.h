// Where a file lives: the device and filesystem under it, for benchmark
// reports ("the file sat on /dev/vda, ext4 mounted at /").
#ifndef ZO_BENCH_FILE_LOCATION_H_
#define ZO_BENCH_FILE_LOCATION_H_

#include <optional>
#include <string>

#include "absl/status/statusor.h"

namespace zo::bench {

struct FileLocation {
  unsigned dev_major = 0;  // stat's st_dev
  unsigned dev_minor = 0;
  std::string source;        // the mount's source, e.g. "/dev/nvme0n1p2"
  std::string fs_type;       // "ext4", "xfs", ...
  std::string mount_point;   // "/"
  std::string block_device;  // /sys/dev/block/MAJ:MIN's name, e.g. "nvme0n1p2"; may be empty

  // "/dev/vda (ext4 at /, dev 254:0)"
  std::string ToString() const;
};

// Picks, from the text of /proc/self/mountinfo, the mount that holds
// `path` (absolute, symlinks resolved): the one with the longest mount point
// that is a prefix of `path`, preferring those whose major:minor is
// dev_major:dev_minor (btrfs subvolumes report another st_dev than their
// mount). Fills everything but block_device; nullopt when no line fits.
std::optional<FileLocation> FindMount(const std::string& mountinfo, unsigned dev_major,
                                      unsigned dev_minor, const std::string& path);

// stat + /proc/self/mountinfo + /sys/dev/block for an existing file.
absl::StatusOr<FileLocation> LocateFile(const std::string& path);

}  // namespace zo::bench

#endif  // ZO_BENCH_FILE_LOCATION_H_
