// The two real engines (io_uring, pread pool) on real O_DIRECT files, the
// fallback between them, and DirectFile.
#include "offload/io/io_engine.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <memory>
#include <ostream>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "common/testing/log_capture.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "offload/aligned_buffer.h"
#include "offload/io/aligned_buffer_pool.h"
#include "offload/io/direct_file.h"
#include "offload/io/fault_injecting_backend.h"
#include "offload/io/internal/create_backend.h"
#include "offload/io/io_error.h"
#include "offload/io/io_test_util.h"
#include "offload/io/pread_backend.h"
#include "offload/io/uring_backend.h"

namespace zo {

// Names the engine in ctest's listing instead of its raw bytes.
void PrintTo(IoEngineKind kind, std::ostream* os) {
  *os << (kind == IoEngineKind::kIoUring ? "io_uring"
          : kind == IoEngineKind::kPread ? "pread"
                                         : "auto");
}
namespace {

using ::testing::AllOf;
using ::testing::AnyOf;
using ::testing::HasSubstr;
using ::zo::testing::FillPattern;
using ::zo::testing::IsOk;
using ::zo::testing::ScopedTempDir;
using ::zo::testing::StatusIs;

constexpr size_t kKiB = 1024;
constexpr size_t kMiB = 1024 * kKiB;

class RealEngineTest : public ::testing::TestWithParam<IoEngineKind> {
 protected:
  void SetUp() override {
    ASSERT_FALSE(dir_.path().empty());
    if (absl::Status s = CheckDirectIo(dir_.path()); !s.ok()) {
      GTEST_SKIP() << "O_DIRECT is not available under " << dir_.path() << ": " << s
                   << " (point TEST_TMPDIR at a directory on ext4 or xfs)";
    }
    if (GetParam() == IoEngineKind::kIoUring) {
      if (absl::Status s = ProbeIoUring(); !s.ok()) GTEST_SKIP() << "no io_uring here: " << s;
    }
    options_.kind = GetParam();
    options_.block_size = 128 * kKiB;
    options_.queue_depth = 4;
    ZO_ASSERT_OK_AND_ASSIGN(engine_, CreateIoEngine(options_));
    ZO_ASSERT_OK_AND_ASSIGN(memory_, AlignedBuffer::Allocate(48 * kMiB));
  }

  // Creates `name` (O_DIRECT) with `bytes` allocated and registers it.
  DirectFile MakeFile(const std::string& name, uint64_t bytes, IoEngine* engine = nullptr) {
    absl::StatusOr<DirectFile> file = DirectFile::Open(dir_.File(name), DirectFile::Mode::kCreate);
    EXPECT_THAT(file, IsOk());
    if (!file.ok()) return DirectFile();
    EXPECT_THAT(file->Allocate(bytes), IsOk());
    EXPECT_THAT((engine ? engine : engine_.get())->RegisterFile(file->fd(), file->path()), IsOk());
    return *std::move(file);
  }

  char* buf(size_t offset = 0) { return memory_.as<char>() + offset; }

  ScopedTempDir dir_;
  IoEngineOptions options_;
  std::unique_ptr<IoEngine> engine_;
  AlignedBuffer memory_;
};

// Cuts [0, total) into random aligned extents of 4 KiB .. 1 MiB, shuffled.
std::vector<std::pair<uint64_t, size_t>> RandomExtents(uint64_t total, std::mt19937_64& rng) {
  std::vector<std::pair<uint64_t, size_t>> extents;
  for (uint64_t at = 0; at < total;) {
    size_t len = (1 + rng() % 256) * 4 * kKiB;
    len = std::min<uint64_t>(len, total - at);
    extents.push_back({at, len});
    at += len;
  }
  std::shuffle(extents.begin(), extents.end(), rng);
  return extents;
}

TEST_P(RealEngineTest, RandomRequestsRoundTripByteForByte) {
  constexpr uint64_t kFile = 16 * kMiB;
  DirectFile file = MakeFile("state.bin", kFile);
  ZO_ASSERT_OK_AND_ASSIGN(auto pool, AlignedBufferPool::Create(4, kMiB));
  ASSERT_THAT(engine_->RegisterBuffers(*pool), IsOk());
  char* const source = buf();
  char* const dest = buf(16 * kMiB);
  FillPattern(source, kFile, 9);
  std::mt19937_64 rng(1234);

  // Writes straight from `source`, in random batches, reaped a few at a time.
  std::vector<std::pair<uint64_t, size_t>> extents = RandomExtents(kFile, rng);
  for (size_t i = 0; i < extents.size();) {
    std::vector<IoRequest> batch;
    for (size_t n = 1 + rng() % 6; n > 0 && i < extents.size(); --n, ++i) {
      const auto [offset, len] = extents[i];
      batch.push_back({IoOp::kWrite, file.fd(), offset, source + offset, len, offset});
    }
    ASSERT_THAT(engine_->Submit(batch), IsOk());
    ZO_ASSERT_OK_AND_ASSIGN(std::vector<IoCompletion> done,
                            engine_->Reap(rng() % (engine_->in_flight() + 1)));
    for (const IoCompletion& c : done) ASSERT_THAT(c.status, IsOk()) << "write at " << c.tag;
  }
  ZO_ASSERT_OK_AND_ASSIGN(std::vector<IoCompletion> rest, engine_->Reap(engine_->in_flight()));
  for (const IoCompletion& c : rest) ASSERT_THAT(c.status, IsOk()) << "write at " << c.tag;

  // Reads along other cuts: through the registered pool, and into plain memory.
  extents = RandomExtents(kFile, rng);
  std::vector<AlignedBufferPool::Lease> leases;
  for (const auto& [offset, len] : extents) {
    if (len <= pool->buffer_bytes() && rng() % 2 == 0) {
      AlignedBufferPool::Lease lease = pool->Acquire();
      ASSERT_THAT(ReadFully(*engine_, file.fd(), offset, lease.data(), len), IsOk());
      std::memcpy(dest + offset, lease.data(), len);
    } else {
      ASSERT_THAT(ReadFully(*engine_, file.fd(), offset, dest + offset, len), IsOk());
    }
  }
  ASSERT_EQ(std::memcmp(source, dest, kFile), 0) << engine_->name();
  EXPECT_THAT(engine_->UnregisterBuffers(), IsOk());
  EXPECT_THAT(engine_->UnregisterFile(file.fd()), IsOk());
}

TEST_P(RealEngineTest, ReadingPastTheEndIsDataLossNamingTheOffset) {
  DirectFile file = MakeFile("short.bin", 0);
  FillPattern(buf(), 12 * kKiB, 3);
  ASSERT_THAT(WriteFully(*engine_, file.fd(), 0, buf(), 12 * kKiB), IsOk());
  EXPECT_THAT(ReadFully(*engine_, file.fd(), 0, buf(kMiB), 16 * kKiB),
              StatusIs(absl::StatusCode::kDataLoss,
                       AllOf(HasSubstr(file.path()), HasSubstr("the file ends at offset 12288"))));
  EXPECT_EQ(std::memcmp(buf(), buf(kMiB), 12 * kKiB), 0);
}

TEST_P(RealEngineTest, AFileOfUnalignedSizeReadsShortAtItsEnd) {
  const std::string path = dir_.File("odd.bin");
  {
    const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(write(fd, std::string(5000, 'z').data(), 5000), 5000);
    close(fd);
  }
  ZO_ASSERT_OK_AND_ASSIGN(DirectFile file, DirectFile::Open(path, DirectFile::Mode::kReadOnly));
  ASSERT_THAT(engine_->RegisterFile(file.fd(), file.path()), IsOk());
  EXPECT_THAT(ReadFully(*engine_, file.fd(), 0, buf(), 8 * kKiB),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("the file ends at offset 5000")));
}

TEST_P(RealEngineTest, MisalignedRequestsNeverReachTheKernel) {
  DirectFile file = MakeFile("a.bin", 64 * kKiB);
  EXPECT_THAT(
      engine_->Submit({{IoOp::kWrite, file.fd(), 512, buf(), 4096, 0}}),
      StatusIs(absl::StatusCode::kInvalidArgument,
               AllOf(HasSubstr(file.path()), HasSubstr("offset is not a multiple of 4096"))));
  EXPECT_THAT(WriteFully(*engine_, file.fd(), 0, buf(100), 4096),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("buffer address")));
  EXPECT_EQ(engine_->in_flight(), 0u);
}

TEST_P(RealEngineTest, KernelErrorsCarryTheFileAndErrno) {
  const std::string path = dir_.File("ro.bin");
  { ZO_ASSERT_OK_AND_ASSIGN(DirectFile made, DirectFile::Open(path, DirectFile::Mode::kCreate)); }
  ZO_ASSERT_OK_AND_ASSIGN(DirectFile file, DirectFile::Open(path, DirectFile::Mode::kReadOnly));
  ASSERT_THAT(engine_->RegisterFile(file.fd(), file.path()), IsOk());
  const absl::Status status = WriteFully(*engine_, file.fd(), 8192, buf(), 4096);
  EXPECT_THAT(status, StatusIs(absl::StatusCode::kInvalidArgument,
                               AllOf(HasSubstr("write of " + path + " at offset 8192"),
                                     HasSubstr("Bad file descriptor (EBADF)"))));
  EXPECT_EQ(ErrnoOf(status), EBADF);
}

TEST_P(RealEngineTest, InjectedFaultsOnRealFiles) {
  FaultPlan plan;
  plan.faults.push_back(IoFault::ShortPiece(1));                   // repaired
  plan.faults.push_back(IoFault::FailRange(kMiB, kMiB + 1, EIO));  // reported
  ZO_ASSERT_OK_AND_ASSIGN(std::unique_ptr<IoBackend> inner, CreateIoBackend(options_));
  ZO_ASSERT_OK_AND_ASSIGN(auto engine,
                          CreateFaultInjectingEngine(options_, std::move(inner), std::move(plan)));
  DirectFile file = MakeFile("faulty.bin", 2 * kMiB, engine.get());
  FillPattern(buf(), 2 * kMiB, 5);
  ASSERT_THAT(WriteFully(*engine, file.fd(), 0, buf(), kMiB), IsOk());
  ASSERT_THAT(ReadFully(*engine, file.fd(), 0, buf(4 * kMiB), kMiB), IsOk());
  EXPECT_EQ(std::memcmp(buf(), buf(4 * kMiB), kMiB), 0);
  EXPECT_THAT(WriteFully(*engine, file.fd(), kMiB, buf(), kMiB),
              StatusIs(absl::StatusCode::kDataLoss,
                       AllOf(HasSubstr("write of " + file.path() + " at offset 1048576"),
                             HasSubstr("EIO"))));
}

TEST_P(RealEngineTest, SubmissionKnobsStillMoveTheBytes) {
  for (const bool sqpoll : {false, true}) {
    IoEngineOptions o = options_;
    o.single_submit = !sqpoll;
    o.sqpoll = sqpoll;
    o.max_files = 0;  // plain fds
    ZO_ASSERT_OK_AND_ASSIGN(auto engine, CreateIoEngine(o));
    DirectFile file = MakeFile(sqpoll ? "sqpoll.bin" : "single.bin", kMiB, engine.get());
    FillPattern(buf(), kMiB, sqpoll);
    ASSERT_THAT(WriteFully(*engine, file.fd(), 0, buf(), kMiB), IsOk());
    ASSERT_THAT(ReadFully(*engine, file.fd(), 0, buf(kMiB), kMiB), IsOk());
    EXPECT_EQ(std::memcmp(buf(), buf(kMiB), kMiB), 0) << "sqpoll " << sqpoll;
  }
}

INSTANTIATE_TEST_SUITE_P(Engines, RealEngineTest,
                         ::testing::Values(IoEngineKind::kIoUring, IoEngineKind::kPread),
                         [](const auto& info) {
                           return info.param == IoEngineKind::kIoUring ? "IoUring" : "Pread";
                         });

TEST(IoEngineFallbackTest, SaysOnceWhyItFallsBack) {
  zo::testing::ScopedLogCapture log;
  std::atomic<bool> logged{false};
  auto no_uring = [](const IoEngineOptions&) -> absl::StatusOr<std::unique_ptr<IoBackend>> {
    return absl::UnimplementedError("io_uring_queue_init: Function not implemented (ENOSYS)");
  };
  for (int i = 0; i < 3; ++i) {
    ZO_ASSERT_OK_AND_ASSIGN(auto backend,
                            io_internal::CreateAutoBackend(IoEngineOptions{}, no_uring, &logged));
    EXPECT_EQ(backend->name(), "pread");
  }
  const std::vector<std::string> lines = log.lines();
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_THAT(lines[0], AllOf(HasSubstr("WARNING"), HasSubstr("ENOSYS"), HasSubstr("pread")));
}

TEST(IoEngineFallbackTest, AutoPicksIoUringWhenItWorks) {
  ZO_ASSERT_OK_AND_ASSIGN(auto engine, CreateIoEngine(IoEngineOptions{}));
  EXPECT_EQ(engine->name(), ProbeIoUring().ok() ? "io_uring" : "pread");
}

TEST(DirectFileTest, ErrorsNameThePath) {
  EXPECT_THAT(DirectFile::Open("/nonexistent/zo/x.bin", DirectFile::Mode::kReadOnly),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("/nonexistent/zo/x.bin")));
}

TEST(DirectFileTest, AllocatesAndReportsSize) {
  ScopedTempDir dir;
  ZO_ASSERT_OK_AND_ASSIGN(DirectFile file,
                          DirectFile::Open(dir.File("f.bin"), DirectFile::Mode::kCreate));
  ASSERT_THAT(file.Allocate(3 * kMiB), IsOk());
  ZO_ASSERT_OK_AND_ASSIGN(uint64_t size, file.Size());
  EXPECT_EQ(size, 3 * kMiB);
  EXPECT_THAT(file.Close(), IsOk());
}

TEST(DirectFileTest, TmpfsIsNamedWhenItRefusesDirectIo) {
  if (FilesystemType("/dev/shm") != "tmpfs") GTEST_SKIP() << "/dev/shm is not tmpfs here";
  // Linux 6.6+ tmpfs takes O_DIRECT; older ones must say why not.
  EXPECT_THAT(CheckDirectIo("/dev/shm"),
              AnyOf(IsOk(), StatusIs(absl::StatusCode::kFailedPrecondition,
                                     AllOf(HasSubstr("tmpfs"), HasSubstr("O_DIRECT")))));
}

}  // namespace
}  // namespace zo
