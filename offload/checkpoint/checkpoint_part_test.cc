#include "offload/checkpoint/checkpoint_part.h"

#include <signal.h>
#include <sys/resource.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <iterator>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "offload/checkpoint/checkpoint_test_util.h"

namespace zo {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::zo::testing::CheckpointPattern;
using ::zo::testing::FlipByte;
using ::zo::testing::FreshTestDir;
using ::zo::testing::IsOk;
using ::zo::testing::StatusIs;

// The layout of design.md: a 4 KiB header, then per chunk master, m and v,
// each padded to 4 KiB.
constexpr uint64_t kHeader = 4096;
constexpr int64_t kBlockElems = 65536 / 4;
uint64_t Region(int64_t elems) { return (static_cast<uint64_t>(elems) * 4 + 4095) / 4096 * 4096; }

struct TestChunk {
  int64_t chunk;
  int64_t flat_begin;
  std::vector<float> master, m, v;
};

TestChunk MakeChunk(int64_t chunk, int64_t flat_begin, int64_t elems) {
  const uint64_t seed = static_cast<uint64_t>(chunk) * 3;
  return {chunk, flat_begin, CheckpointPattern(elems, seed), CheckpointPattern(elems, seed + 1),
          CheckpointPattern(elems, seed + 2)};
}

absl::StatusOr<CheckpointPartSummary> WritePart(const std::string& path,
                                                const std::vector<TestChunk>& chunks) {
  ZO_ASSIGN_OR_RETURN(auto writer, CheckpointPartWriter::Create(path));
  for (const TestChunk& c : chunks) {
    ZO_RETURN_IF_ERROR(writer->AddChunk(c.chunk, c.flat_begin, c.master, c.m, c.v));
  }
  return writer->Finish();
}

class CheckpointPartTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = FreshTestDir(::testing::UnitTest::GetInstance()->current_test_info()->name());
    path_ = dir_ + "/part-00000.zop";
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // Odd sizes: one element, under a block, exactly a block, a block and one,
  // several blocks and a tail.
  std::vector<TestChunk> OddChunks() const {
    return {MakeChunk(0, 0, 1), MakeChunk(3, 300, 1000), MakeChunk(7, 700, kBlockElems),
            MakeChunk(9, 900, kBlockElems + 1), MakeChunk(12, 1200, 100003)};
  }

  std::string dir_;
  std::string path_;
};

TEST_F(CheckpointPartTest, RoundTripsChunksOfOddSizes) {
  const std::vector<TestChunk> chunks = OddChunks();
  ZO_ASSERT_OK_AND_ASSIGN(const CheckpointPartSummary summary, WritePart(path_, chunks));
  EXPECT_EQ(summary.file, "part-00000.zop");
  EXPECT_EQ(summary.bytes, static_cast<int64_t>(std::filesystem::file_size(path_)));

  ZO_ASSERT_OK_AND_ASSIGN(auto reader, CheckpointPartReader::Open(path_));
  EXPECT_EQ(reader->summary(), summary);
  ASSERT_EQ(reader->chunks().size(), chunks.size());
  for (size_t i = 0; i < chunks.size(); ++i) {
    const TestChunk& c = chunks[i];
    const int64_t n = static_cast<int64_t>(c.master.size());
    EXPECT_EQ(reader->chunks()[i], (CheckpointChunk{c.chunk, c.flat_begin, n}));
    std::vector<float> master(n), m(n), v(n);
    ASSERT_THAT(
        reader->Read(c.chunk, 0, absl::MakeSpan(master), absl::MakeSpan(m), absl::MakeSpan(v)),
        IsOk());
    EXPECT_EQ(master, c.master) << "chunk " << c.chunk;
    EXPECT_EQ(m, c.m) << "chunk " << c.chunk;
    EXPECT_EQ(v, c.v) << "chunk " << c.chunk;
  }
}

TEST_F(CheckpointPartTest, PartialReadsAtUnalignedOffsetsAcrossBlocks) {
  const TestChunk c = MakeChunk(4, 4000, 4 * kBlockElems + 123);
  ASSERT_THAT(WritePart(path_, {c}), IsOk());
  ZO_ASSERT_OK_AND_ASSIGN(auto reader, CheckpointPartReader::Open(path_));
  const int64_t n = static_cast<int64_t>(c.master.size());
  const std::vector<std::pair<int64_t, int64_t>> ranges = {
      {0, 1},     {kBlockElems - 1, 2},           {kBlockElems - 3, kBlockElems + 7},
      {1, n - 1}, {3 * kBlockElems + 5, 130},     {n - 1, 1},
      {5, 0},     {kBlockElems, 2 * kBlockElems}, {kBlockElems + 1, 3 * kBlockElems - 1}};
  for (const auto& [offset, len] : ranges) {
    SCOPED_TRACE(absl::StrCat("elements [", offset, ", ", offset + len, ")"));
    std::vector<float> master(len), m(len), v(len);
    ASSERT_THAT(
        reader->Read(c.chunk, offset, absl::MakeSpan(master), absl::MakeSpan(m), absl::MakeSpan(v)),
        IsOk());
    EXPECT_TRUE(std::equal(master.begin(), master.end(), c.master.begin() + offset));
    EXPECT_TRUE(std::equal(m.begin(), m.end(), c.m.begin() + offset));
    EXPECT_TRUE(std::equal(v.begin(), v.end(), c.v.begin() + offset));
    // One array alone.
    std::vector<float> only_v(len);
    ASSERT_THAT(reader->Read(c.chunk, offset, {}, {}, absl::MakeSpan(only_v)), IsOk());
    EXPECT_EQ(only_v, v);
  }
}

TEST_F(CheckpointPartTest, FlippedDataByteIsDataLossAndOtherBlocksStillRead) {
  const std::vector<TestChunk> chunks = {MakeChunk(0, 0, 1000),
                                         MakeChunk(2, 2 * 100000, 3 * kBlockElems)};
  ASSERT_THAT(WritePart(path_, chunks), IsOk());
  // Chunk 2's m array, block 1, byte 10.
  const uint64_t m_offset = kHeader + 3 * Region(1000) + Region(3 * kBlockElems);
  const uint64_t block_offset = m_offset + 65536;
  ASSERT_THAT(FlipByte(path_, block_offset + 10), IsOk());

  ZO_ASSERT_OK_AND_ASSIGN(auto reader, CheckpointPartReader::Open(path_));  // index intact
  std::vector<float> buf(3 * kBlockElems);
  EXPECT_THAT(reader->Read(2, 0, {}, absl::MakeSpan(buf), {}),
              StatusIs(absl::StatusCode::kDataLoss,
                       AllOf(HasSubstr(path_), HasSubstr("chunk 2"), HasSubstr("m block 1"),
                             HasSubstr(absl::StrCat("offset ", block_offset)))));
  // Any read touching block 1 fails, even of one element far from the byte.
  std::vector<float> one(1);
  EXPECT_THAT(reader->Read(2, 2 * kBlockElems - 1, {}, absl::MakeSpan(one), {}),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("m block 1")));
  // Blocks 0 and 2 of m, the other arrays and the other chunk still read.
  std::vector<float> block(kBlockElems);
  ASSERT_THAT(reader->Read(2, 0, {}, absl::MakeSpan(block), {}), IsOk());
  EXPECT_TRUE(std::equal(block.begin(), block.end(), chunks[1].m.begin()));
  ASSERT_THAT(reader->Read(2, 2 * kBlockElems, {}, absl::MakeSpan(block), {}), IsOk());
  EXPECT_TRUE(std::equal(block.begin(), block.end(), chunks[1].m.begin() + 2 * kBlockElems));
  ASSERT_THAT(reader->Read(2, 0, absl::MakeSpan(buf), {}, {}), IsOk());
  EXPECT_EQ(buf, chunks[1].master);
  std::vector<float> small(1000);
  EXPECT_THAT(
      reader->Read(0, 0, absl::MakeSpan(small), absl::MakeSpan(small), absl::MakeSpan(small)),
      IsOk());
}

TEST_F(CheckpointPartTest, TruncatedFileIsDataLossAtOpen) {
  ZO_ASSERT_OK_AND_ASSIGN(const CheckpointPartSummary summary, WritePart(path_, OddChunks()));
  for (const uint64_t size :
       {static_cast<uint64_t>(summary.bytes) - 1, static_cast<uint64_t>(summary.bytes) / 2,
        uint64_t{4200}, uint64_t{100}, uint64_t{0}}) {
    SCOPED_TRACE(absl::StrCat("cut to ", size, " bytes"));
    std::filesystem::resize_file(path_, size);
    EXPECT_THAT(CheckpointPartReader::Open(path_),
                StatusIs(absl::StatusCode::kDataLoss, HasSubstr(path_)));
  }
}

TEST_F(CheckpointPartTest, FlippedIndexByteIsDataLoss) {
  ZO_ASSERT_OK_AND_ASSIGN(const CheckpointPartSummary summary, WritePart(path_, OddChunks()));
  // The trailer's first field is the index offset (design.md).
  std::ifstream in(path_, std::ios::binary);
  in.seekg(summary.bytes - 40);
  uint64_t index_offset = 0;
  in.read(reinterpret_cast<char*>(&index_offset), 8);
  ASSERT_TRUE(in.good());
  ASSERT_THAT(FlipByte(path_, index_offset + 20), IsOk());
  EXPECT_THAT(CheckpointPartReader::Open(path_),
              StatusIs(absl::StatusCode::kDataLoss,
                       AllOf(HasSubstr(path_), HasSubstr("index checksum mismatch"))));
}

TEST_F(CheckpointPartTest, BadMagicIsDataLoss) {
  ASSERT_THAT(WritePart(path_, OddChunks()), IsOk());
  ASSERT_THAT(FlipByte(path_, 3), IsOk());
  EXPECT_THAT(CheckpointPartReader::Open(path_),
              StatusIs(absl::StatusCode::kDataLoss, AllOf(HasSubstr(path_), HasSubstr("magic"))));
}

TEST_F(CheckpointPartTest, UnfinishedWriterRemovesItsFile) {
  {
    ZO_ASSERT_OK_AND_ASSIGN(auto writer, CheckpointPartWriter::Create(path_));
    const TestChunk c = MakeChunk(0, 0, 10);
    ASSERT_THAT(writer->AddChunk(0, 0, c.master, c.m, c.v), IsOk());
    EXPECT_TRUE(std::filesystem::exists(path_));
  }
  EXPECT_FALSE(std::filesystem::exists(path_));
  EXPECT_THAT(CheckpointPartReader::Open(path_),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr(path_)));
}

TEST_F(CheckpointPartTest, CreateRefusesAnExistingFile) {
  ASSERT_THAT(WritePart(path_, OddChunks()), IsOk());
  EXPECT_THAT(CheckpointPartWriter::Create(path_),
              StatusIs(absl::StatusCode::kAlreadyExists, HasSubstr(path_)));
  EXPECT_THAT(CheckpointPartReader::Open(path_), IsOk());  // untouched
}

TEST_F(CheckpointPartTest, AddChunkRejectsBadArguments) {
  ZO_ASSERT_OK_AND_ASSIGN(auto writer, CheckpointPartWriter::Create(path_));
  const TestChunk c = MakeChunk(5, 50, 10);
  const std::vector<float> short_m(9);
  EXPECT_THAT(writer->AddChunk(5, 50, c.master, short_m, c.v),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("one size")));
  EXPECT_THAT(writer->AddChunk(5, 50, {}, {}, {}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("one size")));
  ASSERT_THAT(writer->AddChunk(5, 50, c.master, c.m, c.v), IsOk());
  EXPECT_THAT(writer->AddChunk(5, 50, c.master, c.m, c.v),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("come after chunk 5")));
  EXPECT_THAT(writer->AddChunk(4, 40, c.master, c.m, c.v),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("come after chunk 5")));
  ASSERT_THAT(writer->Finish(), IsOk());
  EXPECT_THAT(writer->Finish(), StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr(path_)));
  ZO_ASSERT_OK_AND_ASSIGN(auto reader, CheckpointPartReader::Open(path_));
  EXPECT_EQ(reader->chunks(), (std::vector<CheckpointChunk>{{5, 50, 10}}));
}

TEST_F(CheckpointPartTest, ReadRejectsBadArguments) {
  ASSERT_THAT(WritePart(path_, {MakeChunk(1, 10, 100)}), IsOk());
  ZO_ASSERT_OK_AND_ASSIGN(auto reader, CheckpointPartReader::Open(path_));
  std::vector<float> a(10), b(9);
  EXPECT_THAT(reader->Read(2, 0, absl::MakeSpan(a), {}, {}),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("no chunk 2")));
  EXPECT_THAT(reader->Read(1, 91, absl::MakeSpan(a), {}, {}),
              StatusIs(absl::StatusCode::kOutOfRange, HasSubstr("[91, 101)")));
  EXPECT_THAT(reader->Read(1, -1, absl::MakeSpan(a), {}, {}),
              StatusIs(absl::StatusCode::kOutOfRange, HasSubstr("chunk 1")));
  EXPECT_THAT(reader->Read(1, 0, absl::MakeSpan(a), absl::MakeSpan(b), {}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("one size")));
  EXPECT_THAT(reader->Read(1, 90, absl::MakeSpan(a), {}, absl::MakeSpan(a)), IsOk());
}

TEST_F(CheckpointPartTest, EmptyPartRoundTrips) {
  // A server that owns no chunk (more servers than chunks) still writes a part.
  ZO_ASSERT_OK_AND_ASSIGN(const CheckpointPartSummary summary, WritePart(path_, {}));
  ZO_ASSERT_OK_AND_ASSIGN(auto reader, CheckpointPartReader::Open(path_));
  EXPECT_TRUE(reader->chunks().empty());
  EXPECT_EQ(reader->summary(), summary);
}

// A file past RLIMIT_FSIZE fails its write with EFBIG (once SIGXFSZ is
// ignored), the portable stand-in for a full disk: both must come back as
// RESOURCE_EXHAUSTED naming the file, sticky, and leave no file behind.
TEST_F(CheckpointPartTest, FileSizeLimitIsResourceExhaustedAndRemovesTheFile) {
  struct sigaction ignore = {}, old_action = {};
  ignore.sa_handler = SIG_IGN;
  ASSERT_EQ(sigaction(SIGXFSZ, &ignore, &old_action), 0);
  rlimit old_limit;
  ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &old_limit), 0);
  const TestChunk c = MakeChunk(0, 0, 1 << 20);  // 4 MiB per array
  absl::Status added, finished;
  {
    ZO_ASSERT_OK_AND_ASSIGN(auto writer, CheckpointPartWriter::Create(path_));
    rlimit limit = old_limit;
    limit.rlim_cur = 1 << 20;
    ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &limit), 0);
    added = writer->AddChunk(0, 0, c.master, c.m, c.v);
    finished = writer->Finish().status();
    ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &old_limit), 0);
  }
  ASSERT_EQ(sigaction(SIGXFSZ, &old_action, nullptr), 0);
  EXPECT_THAT(added, StatusIs(absl::StatusCode::kResourceExhausted,
                              AllOf(HasSubstr(path_), HasSubstr("EFBIG"))));
  EXPECT_EQ(finished, added);
  EXPECT_FALSE(std::filesystem::exists(path_));
}

std::string FileBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// Where each test chunk lies in the part, as a ScatteredPartWriter takes it.
std::vector<CheckpointChunk> LayoutOf(const std::vector<TestChunk>& chunks) {
  std::vector<CheckpointChunk> layout;
  for (const TestChunk& c : chunks) {
    layout.push_back({c.chunk, c.flat_begin, static_cast<int64_t>(c.master.size())});
  }
  return layout;
}

// Runs write(0..count-1) spread over four threads, as snapshot writers do;
// the first failure, or OK.
absl::Status WriteOnFourThreads(size_t count, const std::function<absl::Status(size_t)>& write) {
  std::vector<std::thread> threads;
  std::vector<absl::Status> results(4);
  for (size_t t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (size_t r = t; r < count; r += 4) {
        if (absl::Status s = write(r); !s.ok()) results[t] = s;
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (const absl::Status& s : results) ZO_RETURN_IF_ERROR(s);
  return absl::OkStatus();
}

// Ranges in shuffled order from four threads make the same file, byte for
// byte (checksums included), as the in-order writer given the same chunks.
TEST_F(CheckpointPartTest, ScatteredWritesMakeTheSameFileAsInOrderWrites) {
  const std::vector<TestChunk> chunks = OddChunks();
  ZO_ASSERT_OK_AND_ASSIGN(const CheckpointPartSummary in_order,
                          WritePart(dir_ + "/in-order.zop", chunks));

  ZO_ASSERT_OK_AND_ASSIGN(auto writer, ScatteredPartWriter::Create(path_, LayoutOf(chunks)));
  struct Range {
    size_t index;
    int64_t offset, n;
  };
  std::vector<Range> ranges;
  for (size_t i = 0; i < chunks.size(); ++i) {
    const auto elems = static_cast<int64_t>(chunks[i].master.size());
    // Small ranges (every block read back to hash) and ranges that cover
    // whole blocks and parts of others (hashed as written).
    const int64_t size = i % 2 == 0 ? 777 : 3 * kBlockElems / 2 + 5;
    for (int64_t at = 0; at < elems; at += size) {
      ranges.push_back({i, at, std::min<int64_t>(size, elems - at)});
    }
  }
  std::mt19937 rng(5);
  std::shuffle(ranges.begin(), ranges.end(), rng);
  ASSERT_THAT(WriteOnFourThreads(ranges.size(),
                                 [&](size_t r) {
                                   const Range& g = ranges[r];
                                   const TestChunk& c = chunks[g.index];
                                   return writer->Write(
                                       g.index, g.offset, g.n, c.master.data() + g.offset,
                                       c.m.data() + g.offset, c.v.data() + g.offset);
                                 }),
              IsOk());
  ZO_ASSERT_OK_AND_ASSIGN(const CheckpointPartSummary scattered, writer->Finish());

  EXPECT_EQ(scattered.bytes, in_order.bytes);
  EXPECT_EQ(scattered.index_checksum, in_order.index_checksum);
  EXPECT_TRUE(FileBytes(path_) == FileBytes(dir_ + "/in-order.zop"));
  ZO_ASSERT_OK_AND_ASSIGN(auto reader, CheckpointPartReader::Open(path_));
  EXPECT_EQ(reader->summary(), scattered);
}

TEST_F(CheckpointPartTest, ScatteredWriterRejectsBadRangesAndRemovesAnUnfinishedFile) {
  EXPECT_THAT(ScatteredPartWriter::Create(path_, {{3, 0, 10}, {3, 10, 10}}).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("come after chunk 3")));
  {
    ZO_ASSERT_OK_AND_ASSIGN(auto writer, ScatteredPartWriter::Create(path_, {{1, 0, 10}}));
    const std::vector<float> x(20, 1.0f);
    EXPECT_THAT(writer->Write(0, 5, 6, x.data(), x.data(), x.data()),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("[5, 11)")));
    EXPECT_THAT(writer->Write(1, 0, 1, x.data(), x.data(), x.data()),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("chunk index 1")));
    EXPECT_TRUE(std::filesystem::exists(path_));
  }
  EXPECT_FALSE(std::filesystem::exists(path_));
  EXPECT_THAT(ScatteredPartWriter::Create(dir_ + "/no/such/dir/part.zop", {{0, 0, 1}}).status(),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("no/such/dir")));
}

// The previous version's 16-bit weights of a chunk: a pattern of its own.
std::vector<std::byte> PreviousOf(const TestChunk& c) {
  std::vector<std::byte> out(c.master.size() * 2);
  for (size_t i = 0; i < out.size(); ++i) {
    out[i] = static_cast<std::byte>((i * 131 + static_cast<size_t>(c.chunk) * 7 + 3) & 0xff);
  }
  return out;
}

absl::StatusOr<CheckpointPartSummary> WritePartWithPrevious(const std::string& path,
                                                            const std::vector<TestChunk>& chunks) {
  ZO_ASSIGN_OR_RETURN(auto writer, CheckpointPartWriter::Create(path, 2));
  for (const TestChunk& c : chunks) {
    ZO_RETURN_IF_ERROR(writer->AddChunk(c.chunk, c.flat_begin, c.master, c.m, c.v, PreviousOf(c)));
  }
  return writer->Finish();
}

TEST_F(CheckpointPartTest, PlainPartIsFormatOneWithoutAPreviousVersion) {
  ASSERT_THAT(WritePart(path_, OddChunks()), IsOk());
  EXPECT_EQ(FileBytes(path_)[8], 1) << "format version, byte 8";
  ZO_ASSERT_OK_AND_ASSIGN(auto reader, CheckpointPartReader::Open(path_));
  EXPECT_EQ(reader->previous_bytes(), 0u);
  std::vector<std::byte> out(2);
  EXPECT_THAT(reader->ReadPrevious(0, 0, 1, out.data()),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("no previous version")));
}

// A part carrying the previous version: written in order and scattered
// (from four threads, the previous version in ranges of its own) it is the
// same file, and every range of every array reads back.
TEST_F(CheckpointPartTest, PreviousVersionRoundTripsFromBothWriters) {
  const std::vector<TestChunk> chunks = OddChunks();
  ZO_ASSERT_OK_AND_ASSIGN(const CheckpointPartSummary in_order,
                          WritePartWithPrevious(dir_ + "/in-order.zop", chunks));
  EXPECT_EQ(FileBytes(dir_ + "/in-order.zop")[8], 2) << "format version, byte 8";

  std::vector<std::vector<std::byte>> previous;
  for (const TestChunk& c : chunks) previous.push_back(PreviousOf(c));
  ZO_ASSERT_OK_AND_ASSIGN(auto writer, ScatteredPartWriter::Create(path_, LayoutOf(chunks), 2));
  EXPECT_EQ(writer->previous_bytes(), 2u);
  struct Range {
    size_t index;
    int64_t offset, n;
    bool previous;
  };
  std::vector<Range> ranges;
  for (size_t i = 0; i < chunks.size(); ++i) {
    const auto elems = static_cast<int64_t>(chunks[i].master.size());
    for (int64_t at = 0; at < elems; at += 999) {
      ranges.push_back({i, at, std::min<int64_t>(999, elems - at), false});
    }
    // Ranges that cover whole 32 Ki-element blocks of 2-byte data and parts of others.
    for (int64_t at = 0; at < elems; at += 40000) {
      ranges.push_back({i, at, std::min<int64_t>(40000, elems - at), true});
    }
  }
  std::mt19937 rng(9);
  std::shuffle(ranges.begin(), ranges.end(), rng);
  ASSERT_THAT(WriteOnFourThreads(
                  ranges.size(),
                  [&](size_t r) {
                    const Range& g = ranges[r];
                    const TestChunk& c = chunks[g.index];
                    return g.previous
                               ? writer->WritePrevious(g.index, g.offset, g.n,
                                                       previous[g.index].data() + 2 * g.offset)
                               : writer->Write(g.index, g.offset, g.n, c.master.data() + g.offset,
                                               c.m.data() + g.offset, c.v.data() + g.offset);
                  }),
              IsOk());
  ZO_ASSERT_OK_AND_ASSIGN(const CheckpointPartSummary scattered, writer->Finish());
  EXPECT_EQ(scattered.index_checksum, in_order.index_checksum);
  EXPECT_TRUE(FileBytes(path_) == FileBytes(dir_ + "/in-order.zop"));

  ZO_ASSERT_OK_AND_ASSIGN(auto reader, CheckpointPartReader::Open(path_));
  EXPECT_EQ(reader->previous_bytes(), 2u);
  for (size_t i = 0; i < chunks.size(); ++i) {
    const TestChunk& c = chunks[i];
    const auto n = static_cast<int64_t>(c.master.size());
    std::vector<float> master(n), m(n), v(n);
    ASSERT_THAT(
        reader->Read(c.chunk, 0, absl::MakeSpan(master), absl::MakeSpan(m), absl::MakeSpan(v)),
        IsOk());
    EXPECT_TRUE(master == c.master && m == c.m && v == c.v) << "chunk " << c.chunk;
    std::vector<std::byte> whole(2 * n);
    ASSERT_THAT(reader->ReadPrevious(c.chunk, 0, n, whole.data()), IsOk());
    EXPECT_TRUE(whole == previous[i]) << "chunk " << c.chunk;
    if (n > 3) {  // unaligned, and across a block border when the chunk has two
      const int64_t at = n > 32768 ? 32767 : 1;
      const int64_t len = n - at - 1;
      std::vector<std::byte> part(2 * len);
      ASSERT_THAT(reader->ReadPrevious(c.chunk, at, len, part.data()), IsOk());
      EXPECT_TRUE(std::equal(part.begin(), part.end(), previous[i].begin() + 2 * at));
    }
  }
  std::vector<std::byte> two(4);
  EXPECT_THAT(reader->ReadPrevious(0, 0, 2, two.data()),
              StatusIs(absl::StatusCode::kOutOfRange, HasSubstr("[0, 2)")));
}

TEST_F(CheckpointPartTest, FlippedPreviousVersionByteIsDataLossNamingIt) {
  const std::vector<TestChunk> chunks = {MakeChunk(5, 500, 3 * kBlockElems)};
  ASSERT_THAT(WritePartWithPrevious(path_, chunks), IsOk());
  // After master, m and v: the previous version, its block 1 (32 Ki elements in).
  const uint64_t previous_offset = kHeader + 3 * Region(3 * kBlockElems);
  ASSERT_THAT(FlipByte(path_, previous_offset + 65536 + 3), IsOk());
  ZO_ASSERT_OK_AND_ASSIGN(auto reader, CheckpointPartReader::Open(path_));
  const int64_t n = 3 * kBlockElems;
  std::vector<std::byte> out(2 * n);
  EXPECT_THAT(reader->ReadPrevious(5, 0, n, out.data()),
              StatusIs(absl::StatusCode::kDataLoss,
                       AllOf(HasSubstr("previous block 1"), HasSubstr("chunk 5"))));
  ASSERT_THAT(reader->ReadPrevious(5, 0, 32768, out.data()), IsOk());  // block 0
  std::vector<float> master(n);
  EXPECT_THAT(reader->Read(5, 0, absl::MakeSpan(master), {}, {}), IsOk());
  EXPECT_EQ(master, chunks[0].master);
}

// Runs of pieces (as the background writer sends its staged copies): in
// page-aligned buffers, some whole pages and some not, some runs starting
// off a page; with single-range writes for the rest, the file is byte for
// byte the in-order writer's, whichever way (direct or not) each went.
TEST_F(CheckpointPartTest, RunsOfPiecesMakeTheSameFileAsInOrderWrites) {
  const std::vector<TestChunk> chunks = {MakeChunk(2, 0, 5 * kBlockElems + 777),
                                         MakeChunk(6, 900000, 3000)};
  ZO_ASSERT_OK_AND_ASSIGN(const CheckpointPartSummary in_order,
                          WritePart(dir_ + "/in-order.zop", chunks));
  ZO_ASSERT_OK_AND_ASSIGN(auto writer, ScatteredPartWriter::Create(path_, LayoutOf(chunks)));
  std::cout << "writes_direct: " << writer->writes_direct() << "\n";
  // Each piece copied into page-aligned memory of its own, as staging does.
  struct Copy {
    std::unique_ptr<float[], decltype(&std::free)> data{nullptr, &std::free};
    ScatteredPartWriter::Piece piece;
  };
  auto copy_of = [](const TestChunk& c, int64_t at, int64_t n) {
    Copy copy;
    const size_t bytes = (3 * static_cast<size_t>(n) * 4 + 4095) / 4096 * 4096 + 8192;
    copy.data.reset(static_cast<float*>(std::aligned_alloc(4096, bytes)));
    // Arrays on page boundaries when n is whole pages, as in staging.
    const int64_t stride = (n + 1023) / 1024 * 1024;
    float* to = copy.data.get();
    std::copy_n(c.master.begin() + at, n, to);
    std::copy_n(c.m.begin() + at, n, to + stride);
    std::copy_n(c.v.begin() + at, n, to + 2 * stride);
    copy.piece = {n, to, to + stride, to + 2 * stride};
    return copy;
  };
  const TestChunk& big = chunks[0];
  // [0, 1000): a plain write; then a run from element 1000 (off a page);
  // then a run from 4096 (a page) of whole-page pieces and a ragged last one;
  // then the rest as one run.
  ASSERT_THAT(writer->Write(0, 0, 1000, big.master.data(), big.m.data(), big.v.data()), IsOk());
  {
    std::vector<Copy> copies;
    copies.push_back(copy_of(big, 1000, 1024));
    copies.push_back(copy_of(big, 2024, 2072));
    std::vector<ScatteredPartWriter::Piece> pieces = {copies[0].piece, copies[1].piece};
    ASSERT_THAT(writer->WriteRun(0, 1000, pieces), IsOk());
  }
  {
    std::vector<Copy> copies;
    copies.push_back(copy_of(big, 4096, kBlockElems));
    copies.push_back(copy_of(big, 4096 + kBlockElems, 2 * kBlockElems));
    copies.push_back(copy_of(big, 4096 + 3 * kBlockElems, 1500));
    std::vector<ScatteredPartWriter::Piece> pieces;
    for (const Copy& c : copies) pieces.push_back(c.piece);
    ASSERT_THAT(writer->WriteRun(0, 4096, pieces), IsOk());
  }
  const int64_t rest = 4096 + 3 * kBlockElems + 1500;
  {
    Copy copy = copy_of(big, rest, static_cast<int64_t>(big.master.size()) - rest);
    ASSERT_THAT(writer->WriteRun(0, rest, {copy.piece}), IsOk());
  }
  {
    Copy copy = copy_of(chunks[1], 0, 3000);
    ASSERT_THAT(writer->WriteRun(1, 0, {copy.piece}), IsOk());
  }
  EXPECT_THAT(writer->WriteRun(1, 2999, {copy_of(chunks[1], 0, 2).piece}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("[2999, 3001)")));
  ZO_ASSERT_OK_AND_ASSIGN(const CheckpointPartSummary scattered, writer->Finish());
  EXPECT_EQ(scattered.index_checksum, in_order.index_checksum);
  EXPECT_TRUE(FileBytes(path_) == FileBytes(dir_ + "/in-order.zop"));
}

}  // namespace
}  // namespace zo
