#include "worker/client/internal/region_credits.h"

#include <atomic>
#include <memory>
#include <thread>

#include "common/shared_futex.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace zo::client_internal {
namespace {

using ::testing::HasSubstr;
using ::zo::testing::IsOk;
using ::zo::testing::StatusIs;

// A call that has ended or not, as the test says.
class FakeCall final : public PushCall {
 public:
  void Close() override {}
  void Cancel() override {}
  bool WaitFor(absl::Duration) override { return ended; }
  absl::Status status() const override { return absl::OkStatus(); }
  std::atomic<bool> ended = false;
};

TEST(RegionCreditsTest, APieceWaitsForTheLastPieceThatWroteItsBytesThisStep) {
  RegionCredits credits;
  auto call = std::make_shared<FakeCall>();
  EXPECT_FALSE(credits.LastWriter(1, 0, 100).has_value());
  // Micro-batch 0: two tensors' pieces side by side.
  const uint32_t a = credits.Wrote(1, 0, 100, call);
  const uint32_t b = credits.Wrote(1, 100, 300, call);
  EXPECT_TRUE(RegionCredits::SentAfter(b, a));
  EXPECT_EQ(credits.LastWriter(1, 0, 100)->seq, a);
  EXPECT_EQ(credits.LastWriter(1, 50, 150)->seq, b);  // both: the later
  EXPECT_EQ(credits.LastWriter(1, 299, 1000)->seq, b);
  EXPECT_FALSE(credits.LastWriter(1, 300, 1000).has_value());
  EXPECT_EQ(credits.LastWriter(1, 0, 100)->call, call);
  // Micro-batch 1 rewrites the middle of the second: the parts around it
  // still belong to b.
  const uint32_t c = credits.Wrote(1, 150, 200, call);
  EXPECT_EQ(credits.LastWriter(1, 100, 150)->seq, b);
  EXPECT_EQ(credits.LastWriter(1, 160, 170)->seq, c);
  EXPECT_EQ(credits.LastWriter(1, 200, 300)->seq, b);
  EXPECT_EQ(credits.LastWriter(1, 0, 1000)->seq, c);
  // Step 2 has the other area, step 3 this one again, its writes forgotten;
  // the numbers go on growing per area.
  EXPECT_FALSE(credits.LastWriter(2, 0, 1000).has_value());
  const uint32_t d = credits.Wrote(2, 0, 100, call);
  EXPECT_FALSE(credits.LastWriter(3, 0, 1000).has_value());
  const uint32_t e = credits.Wrote(3, 400, 500, call);
  EXPECT_TRUE(RegionCredits::SentAfter(e, c));
  EXPECT_FALSE(credits.LastWriter(3, 0, 400).has_value());
  EXPECT_EQ(credits.LastWriter(2, 0, 100)->seq, d);
}

TEST(RegionCreditsTest, SequenceNumbersCompareAcrossTheirWrap) {
  EXPECT_TRUE(RegionCredits::SentAfter(3, 0xfffffffeu));
  EXPECT_FALSE(RegionCredits::SentAfter(0xfffffffeu, 3));
  EXPECT_FALSE(RegionCredits::SentAfter(5, 5));
}

// The acknowledgement slot as the server writes it (SharedRegion::Acknowledge).
void Acknowledge(uint32_t* slot, uint32_t ack) {
  std::atomic_ref<uint32_t>(slot[0]).store(ack);
  if (std::atomic_ref<uint32_t>(slot[1]).load() != 0) SharedFutexWakeAll(slot);
}

TEST(RegionCreditsTest, TheWaitEndsWhenTheServerAcknowledgesThePiece) {
  alignas(8) uint32_t slot[2] = {4, 0};
  auto call = std::make_shared<FakeCall>();
  // Already acknowledged (or a later one): no wait.
  EXPECT_THAT(AwaitRegionAck(slot, {4, call}, absl::InfinitePast(), "s"), IsOk());
  EXPECT_THAT(AwaitRegionAck(slot, {3, call}, absl::InfinitePast(), "s"), IsOk());
  // Not yet: the waiter counts itself, sleeps, and is woken.
  std::thread server([&] {
    while (std::atomic_ref<uint32_t>(slot[1]).load() == 0) std::this_thread::yield();
    Acknowledge(slot, 5);  // not enough
    Acknowledge(slot, 6);
  });
  EXPECT_THAT(AwaitRegionAck(slot, {6, call}, absl::InfiniteFuture(), "s"), IsOk());
  server.join();
  EXPECT_EQ(slot[0], 6u);
  EXPECT_EQ(slot[1], 0u) << "the waiter still counts itself";
}

TEST(RegionCreditsTest, AnEndedCallOrTheDeadlineEndsTheWait) {
  alignas(8) uint32_t slot[2] = {0, 0};
  auto call = std::make_shared<FakeCall>();
  EXPECT_THAT(AwaitRegionAck(slot, {1, call}, absl::Now(), "server-a"),
              StatusIs(absl::StatusCode::kDeadlineExceeded, HasSubstr("server-a")));
  EXPECT_EQ(slot[1], 0u);
  // The server reads nothing of an ended call: its bytes are free.
  std::thread end([&] {
    while (std::atomic_ref<uint32_t>(slot[1]).load() == 0) std::this_thread::yield();
    call->ended = true;
  });
  EXPECT_THAT(AwaitRegionAck(slot, {1, call}, absl::InfiniteFuture(), "server-a"), IsOk());
  end.join();
  EXPECT_EQ(slot[0], 0u);
}

}  // namespace
}  // namespace zo::client_internal
