#include "common/stream_copy.h"

#include <algorithm>
#include <cstddef>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace zo {
namespace {

// Every byte of the source lands, wherever the destination starts (the
// 16-byte stores begin at its first aligned byte) and whatever the length,
// and nothing past the n bytes changes.
TEST(StreamCopyTest, CopiesEveryByteAtEveryOffsetAndLength) {
  std::mt19937 rng(7);
  std::vector<std::byte> src(20000);
  for (std::byte& b : src) b = static_cast<std::byte>(rng());
  for (size_t n : {size_t{0}, size_t{1}, size_t{15}, size_t{16}, size_t{17}, size_t{31}, size_t{33},
                   size_t{4096}, size_t{19999}}) {
    for (size_t src_offset : {size_t{0}, size_t{1}, size_t{7}}) {
      for (size_t dst_offset = 0; dst_offset < 17; ++dst_offset) {
        std::vector<std::byte> want(n + 64, std::byte{0xAB});
        std::vector<std::byte> got = want;
        std::copy_n(src.begin() + static_cast<std::ptrdiff_t>(src_offset), n,
                    want.begin() + static_cast<std::ptrdiff_t>(dst_offset));
        StreamCopy(src.data() + src_offset, got.data() + dst_offset, n);
        ASSERT_EQ(got, want) << "n " << n << ", source offset " << src_offset
                             << ", destination offset " << dst_offset;
      }
    }
  }
}

}  // namespace
}  // namespace zo
