// Helpers for the io tests: a scratch directory on a real filesystem and
// reproducible bytes.
#ifndef ZO_OFFLOAD_IO_IO_TEST_UTIL_H_
#define ZO_OFFLOAD_IO_IO_TEST_UTIL_H_

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "gtest/gtest.h"

namespace zo::testing {

// A fresh directory under $TEST_TMPDIR (else /tmp), removed with its
// contents at the end.
class ScopedTempDir {
 public:
  ScopedTempDir() {
    const char* root = std::getenv("TEST_TMPDIR");
    std::string pattern =
        std::string(root != nullptr && *root != '\0' ? root : "/tmp") + "/zo_io_test_XXXXXX";
    if (mkdtemp(pattern.data()) != nullptr) path_ = pattern;
    EXPECT_FALSE(path_.empty()) << "cannot create a directory like " << pattern;
  }
  ~ScopedTempDir() {
    std::error_code ignored;
    if (!path_.empty()) std::filesystem::remove_all(path_, ignored);
  }
  ScopedTempDir(const ScopedTempDir&) = delete;
  ScopedTempDir& operator=(const ScopedTempDir&) = delete;

  const std::string& path() const { return path_; }
  std::string File(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// Bytes that depend on (seed, position), so a misplaced block shows.
inline void FillPattern(void* buf, size_t len, uint64_t seed) {
  auto* p = static_cast<unsigned char*>(buf);
  uint64_t x = seed * 0x9e3779b97f4a7c15ULL + 1;
  for (size_t i = 0; i < len; ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    p[i] = static_cast<unsigned char>(x);
  }
}

}  // namespace zo::testing

#endif  // ZO_OFFLOAD_IO_IO_TEST_UTIL_H_
