// A disk a test can fill: a small tmpfs mounted at a directory for the
// object's lifetime. Mounting needs root with CAP_SYS_ADMIN; where it
// fails, mounted() is false and error() says why, for the test to skip.
#ifndef ZO_COMMON_TESTING_SMALL_TMPFS_H_
#define ZO_COMMON_TESTING_SMALL_TMPFS_H_

#include <string>

#include "absl/status/status.h"

namespace zo::testing {

class SmallTmpfs {
 public:
  // `size` as mount(8) takes it: "64k", "256m".
  SmallTmpfs(const std::string& dir, const std::string& size);
  ~SmallTmpfs();  // unmounts lazily: files still open there stay readable

  bool mounted() const { return error_.empty(); }
  const std::string& error() const { return error_; }

  // Takes every free byte (a file named "disk-filler"); Free gives them back.
  absl::Status Fill();
  void Free();

  SmallTmpfs(const SmallTmpfs&) = delete;
  SmallTmpfs& operator=(const SmallTmpfs&) = delete;

 private:
  std::string Filler() const { return dir_ + "/disk-filler"; }

  std::string dir_;
  std::string error_;
};

}  // namespace zo::testing

#endif  // ZO_COMMON_TESTING_SMALL_TMPFS_H_
