// What the ParamVersions tests share (param_versions_test.cc,
// param_versions_master_test.cc, param_versions_writing_test.cc): a buffer
// size, an update blocked on readers, and the fixture of versions served
// from a job's fp32 master.
#ifndef ZO_SERVER_PARAM_VERSIONS_TEST_UTIL_H_
#define ZO_SERVER_PARAM_VERSIONS_TEST_UTIL_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/convert.h"
#include "common/dtype.h"
#include "common/status_macros.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/param_versions.h"

namespace zo::testing {

inline constexpr int64_t kElems = 64;
inline constexpr auto kFailedPrecondition = absl::StatusCode::kFailedPrecondition;

// Returns once `v` has blocked a caller `n` times in all, i.e. the other
// thread is waiting for readers (an observed state, not a sleep).
inline void AwaitBlocked(const ParamVersions& v, int64_t n) {
  while (v.times_blocked() < n) std::this_thread::yield();
}

// An update begun on another thread (BeginWrite), once it is seen waiting
// for readers: `began` turns true when BeginWrite returns; Join waits for it.
class BlockedUpdate {
 public:
  explicit BlockedUpdate(ParamVersions& v, ParamVersions::Undo undo = nullptr)
      : blocks_before_(v.times_blocked()), thread_([this, &v, undo = std::move(undo)] {
          target_ = v.BeginWrite(undo);
          began = true;
        }) {
    AwaitBlocked(v, blocks_before_ + 1);
  }
  ~BlockedUpdate() {
    if (thread_.joinable()) thread_.join();
  }
  void* Join() {
    thread_.join();
    return target_;
  }
  std::atomic<bool> began{false};

 private:
  const int64_t blocks_before_;  // read before the thread starts
  void* target_ = nullptr;
  std::thread thread_;
};

// A job's fp32 master in miniature: version k's element i is k * 100 + i / 2,
// exact in fp16 for k < 10, so a served element names its version.
class FromMasterTest : public ::testing::Test {
 protected:
  std::unique_ptr<ParamVersions> Make(bool keep_previous) {
    absl::StatusOr<std::unique_ptr<ParamVersions>> v = ParamVersions::CreateFromMaster(
        kElems, DType::kFloat16,
        {.round_master =
             [this](int64_t offset, int64_t n, void* out) {
               if (while_reading_master_) while_reading_master_();
               FloatToHalf(master_.data() + offset, static_cast<uint16_t*>(out),
                           static_cast<size_t>(n));
             },
         .keep_previous = keep_previous});
    EXPECT_THAT(v, IsOk());
    return v.ok() ? std::move(v).value() : nullptr;
  }

  static float Value(int version, int64_t i) {
    return static_cast<float>(version * 100) + i * 0.5f;
  }

  void SetMaster(int version) {
    for (int64_t i = 0; i < kElems; ++i) master_[i] = Value(version, i);
    master_version_ = version;
  }

  // The undo of an update from version `from` to `to`: recomputes the old
  // weights from the master as the update left it (so a read that ran ahead
  // of the update would read a mix), and gets every wrong_every_-th element
  // wrong by one unit in the last place, which the corrections must mend.
  ParamVersions::Undo UndoOf(int from, int to) {
    return [this, from, to](int64_t offset, int64_t n, void* out) {
      auto* half = static_cast<uint16_t*>(out);
      for (int64_t i = 0; i < n; ++i) {
        const float old = master_[offset + i] - static_cast<float>((to - from) * 100);
        FloatToHalf(&old, &half[i], 1);
        if ((offset + i) % wrong_every_ == 0) half[i] ^= 1;
      }
    };
  }

  // Sets master elements [offset, offset + n) to `version`'s values, as
  // one tile of an update begun with BeginWrite, and with a previous
  // version kept tells it the tile's old weights.
  void UpdateRange(ParamVersions& v, int version, int64_t offset, int64_t n) {
    if (v.keep_previous()) v.ClaimRange(offset, n);
    std::vector<uint16_t> old(n);
    FloatToHalf(master_.data() + offset, old.data(), static_cast<size_t>(n));
    for (int64_t i = offset; i < offset + n; ++i) master_[i] = Value(version, i);
    if (v.keep_previous()) {
      v.MarkKept(offset, n, old.data());
    } else {
      v.MarkDone(offset, n);
    }
  }

  // Begins the update from the master's version to `version`.
  void BeginUpdate(ParamVersions& v, int version) {
    EXPECT_EQ(v.BeginWrite(v.keep_previous() ? UndoOf(master_version_, version) : nullptr),
              nullptr);
  }
  void CommitUpdate(ParamVersions& v, int version) {
    v.CommitWrite(version);
    master_version_ = version;
  }

  // An update to `version`, as the job's step makes it: tile by tile.
  void Update(ParamVersions& v, int version) {
    BeginUpdate(v, version);
    for (int64_t offset = 0; offset < kElems; offset += kTile) {
      UpdateRange(v, version, offset, kTile);
    }
    CommitUpdate(v, version);
  }
  static constexpr int64_t kTile = 16;

  // Which version elements [offset, offset + n) of `lease` read as; -1 for
  // a mix.
  static absl::StatusOr<int> ReadsAs(const ParamVersions::Lease& lease, int64_t offset = 0,
                                     int64_t n = kElems) {
    std::vector<uint16_t> half(n);
    ZO_RETURN_IF_ERROR(lease.Read(offset, n, half.data()));
    std::vector<float> got(n);
    HalfToFloat(half.data(), got.data(), half.size());
    const int version = static_cast<int>(got[0] - offset * 0.5f) / 100;
    for (int64_t i = 0; i < n; ++i) {
      if (got[i] != static_cast<float>(version * 100) + (offset + i) * 0.5f) return -1;
    }
    return version;
  }

  // A read of [offset, offset + n) begun on another thread, once it is seen
  // waiting for its range to be done: `done` turns true when it returns;
  // Join gives what it read as.
  class BlockedRead {
   public:
    BlockedRead(ParamVersions& v, const ParamVersions::Lease& lease, int64_t offset, int64_t n)
        : blocks_before_(v.times_blocked()), thread_([this, &lease, offset, n] {
            result_ = ReadsAs(lease, offset, n);
            done = true;
          }) {
      AwaitBlocked(v, blocks_before_ + 1);
    }
    ~BlockedRead() {
      if (thread_.joinable()) thread_.join();
    }
    absl::StatusOr<int> Join() {
      thread_.join();
      return result_;
    }
    std::atomic<bool> done{false};

   private:
    const int64_t blocks_before_;  // read before the thread starts
    absl::StatusOr<int> result_ = -2;
    std::thread thread_;
  };

  std::vector<float> master_ = std::vector<float>(kElems, 0.0f);
  int master_version_ = 0;
  int64_t wrong_every_ = 5;
  // Runs as each read of the master begins (on the reading thread): lets a
  // test hold a read there.
  std::function<void()> while_reading_master_;
};

}  // namespace zo::testing

#endif  // ZO_SERVER_PARAM_VERSIONS_TEST_UTIL_H_
