// WeightFile on a real file through the real engine: params come back from
// the aligned places they were written to, whatever the batch they were
// written in; the file has no name once open; what is asked wrongly is
// refused naming the file.
#include "worker/train/weight_file.h"

#include <cstddef>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <vector>

#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "offload/aligned_buffer.h"
#include "offload/io/io_test_util.h"

namespace zo::train {
namespace {

using ::testing::HasSubstr;
using ::zo::testing::IsOk;
using ::zo::testing::ScopedTempDir;
using ::zo::testing::StatusIs;

// Param sizes that straddle the alignment: under, at and over 4 KiB.
const std::vector<int64_t> kSizes = {100, 4096, 5000, 8192, 1};

std::byte Pattern(size_t param, int64_t i, int round) {
  return static_cast<std::byte>((param * 31 + static_cast<size_t>(i) * 7 + round * 101) & 0xFF);
}

// Params [first, last) laid out as the file is, filled with round `round`.
void Fill(const WeightFile& f, size_t first, size_t last, int round, std::byte* buffer) {
  for (size_t p = first; p < last; ++p) {
    std::byte* at = buffer + (f.offset(p) - f.offset(first));
    for (int64_t i = 0; i < f.bytes(p); ++i) at[i] = Pattern(p, i, round);
  }
}

void ExpectRound(const WeightFile& f, size_t first, size_t last, int round,
                 const std::byte* buffer) {
  for (size_t p = first; p < last; ++p) {
    const std::byte* at = buffer + (f.offset(p) - f.offset(first));
    for (int64_t i = 0; i < f.bytes(p); ++i) {
      ASSERT_EQ(at[i], Pattern(p, i, round)) << "param " << p << " byte " << i;
    }
  }
}

TEST(WeightFileTest, ParamsComeBackFromTheirAlignedPlacesWhateverTheBatch) {
  ScopedTempDir dir;
  ZO_ASSERT_OK_AND_ASSIGN(auto file,
                          WeightFile::Create({.dir = dir.path(), .io = {}, .param_bytes = kSizes}));
  EXPECT_EQ(file->params(), kSizes.size());
  EXPECT_EQ(file->offset(1), 4096);
  EXPECT_EQ(file->offset(3), 4 * 4096);
  EXPECT_EQ(file->file_bytes(), 7 * 4096);
  EXPECT_EQ(file->RangeBytes(1, 3), 3 * 4096);
  // Once open it has no name: a crash leaves nothing behind.
  EXPECT_TRUE(std::filesystem::is_empty(dir.path()));

  ZO_ASSERT_OK_AND_ASSIGN(AlignedBuffer buffer,
                          AlignedBuffer::Allocate(static_cast<size_t>(file->file_bytes())));
  auto* b = buffer.as<std::byte>();
  // Written in two batches, read back in another split.
  Fill(*file, 0, 2, 1, b);
  ASSERT_THAT(file->Write(0, 2, b), IsOk());
  Fill(*file, 2, 5, 1, b);
  ASSERT_THAT(file->Write(2, 5, b), IsOk());
  ASSERT_THAT(file->Read(1, 4, b), IsOk());
  ExpectRound(*file, 1, 4, 1, b);
  ASSERT_THAT(file->Read(0, 1, b), IsOk());
  ExpectRound(*file, 0, 1, 1, b);
  // A later step's weights replace the earlier ones in place.
  Fill(*file, 3, 5, 2, b);
  ASSERT_THAT(file->Write(3, 5, b), IsOk());
  ASSERT_THAT(file->Read(2, 5, b), IsOk());
  ExpectRound(*file, 2, 3, 1, b);
  ExpectRound(*file, 3, 5, 2, b + (file->offset(3) - file->offset(2)));
}

TEST(WeightFileTest, WrongRangesAndUnalignedBuffersAreRefusedNamingTheFile) {
  ScopedTempDir dir;
  ZO_ASSERT_OK_AND_ASSIGN(auto file,
                          WeightFile::Create({.dir = dir.path(), .io = {}, .param_bytes = kSizes}));
  ZO_ASSERT_OK_AND_ASSIGN(AlignedBuffer buffer,
                          AlignedBuffer::Allocate(static_cast<size_t>(file->file_bytes()) + 4096));
  auto* b = buffer.as<std::byte>();
  EXPECT_THAT(file->Read(3, 6, b), StatusIs(absl::StatusCode::kInvalidArgument,
                                            HasSubstr("params [3, 6) of the 5 in " + dir.path())));
  EXPECT_THAT(file->Write(2, 2, b),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("params [2, 2)")));
  EXPECT_THAT(file->Read(0, 1, b + 8),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("not 4096-byte aligned")));
}

TEST(WeightFileTest, ADirectoryThatIsNotThereIsRefusedAtCreation) {
  const absl::StatusOr<std::unique_ptr<WeightFile>> file =
      WeightFile::Create({.dir = "/nonexistent/zo-weights", .io = {}, .param_bytes = kSizes});
  ASSERT_FALSE(file.ok());
  EXPECT_THAT(file.status().message(), HasSubstr("/nonexistent/zo-weights"));
}

TEST(WeightFileTest, TheBufferMustHoldTheLargestParameter) {
  EXPECT_THAT(CheckWeightBuffer(1000, "h.0.mlp.fc.weight", 1000), IsOk());
  EXPECT_THAT(CheckWeightBuffer(1000, "h.0.mlp.fc.weight", 1001),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("offload_param.buffer_size = 1000: h.0.mlp.fc.weight has 1001")));
}

}  // namespace
}  // namespace zo::train
