// A prefetch across a skipped step, for every route that pulls into places
// the update writes (in_process_route_test, shared_memory_route_test).
//
// A worker prefetches step s + 1's weights (version s) while it pushes step
// s: the pull waits while step s's chunks are speculated, and the
// speculation writes their weights ahead into the pull's places. When the
// step is then skipped (an overflow), version s equals the version the
// places held before, yet they hold the dropped speculation: the pull must
// leave them holding version s, not report it unchanged over them.
#ifndef ZO_TESTS_SERVER_SKIPPED_PREFETCH_H_
#define ZO_TESTS_SERVER_SKIPPED_PREFETCH_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <thread>
#include <vector>

#include "absl/types/span.h"
#include "common/fp16.h"
#include "common/testing/status_matchers.h"
#include "gtest/gtest.h"
#include "tests/server/training_harness.h"
#include "worker/client/offload_client.h"

namespace zo::testing {

// fp16 (so a step can overflow), chunks of 64 elements: four chunks, each
// speculated as it fills.
inline constexpr char kSkippedConfig[] = R"({"train_batch_size": 1,
    "fp16": {"enabled": true, "initial_scale_power": 4},
    "optimizer": {"type": "AdamW", "params": {"lr": 0.05}}, "zo": {"chunk_elems": 64}})";
inline constexpr int64_t kSkippedElems = 256;
inline const std::vector<TensorSpec> kSkippedManifest = {
    {.name = "w", .shape = {kSkippedElems}, .dtype = DType::kFloat16}};

// Steps 1 and 2 of a fresh kSkippedConfig job, pulled for steps 2 and 3
// into `w` (kSkippedElems fp16 elements), the second pull waiting while
// step 2 is pushed; step 2 overflows. Then `w` must hold version 2.
inline void PrefetchAcrossASkippedStep(OffloadClient& client, absl::Span<std::byte> w) {
  ZO_ASSERT_OK_AND_ASSIGN(const v1::JobStatus opened, client.JobStatus());
  ASSERT_EQ(opened.no_speculation(), "");
  ASSERT_EQ(w.size(), static_cast<size_t>(kSkippedElems) * 2);
  std::vector<float> init(kSkippedElems);
  for (int64_t i = 0; i < kSkippedElems; ++i) init[i] = 0.01f * static_cast<float>(i % 17);
  ASSERT_THAT(client.InitParams(0, init), IsOk());
  std::vector<uint16_t> g(kSkippedElems);
  for (int64_t i = 0; i < kSkippedElems; ++i) {
    g[i] = FloatToHalfBits(0.25f * static_cast<float>(i % 7) - 0.75f);
  }
  const auto bytes = [&](int64_t from, int64_t to) {
    return absl::Span<const std::byte>(reinterpret_cast<const std::byte*>(g.data() + from),
                                       static_cast<size_t>(to - from) * 2);
  };
  const std::vector<absl::Span<std::byte>> dst = {w};
  ASSERT_THAT(client.Push(1, 0, bytes(0, kSkippedElems)), IsOk());
  ASSERT_THAT(client.FinishStep(1), IsOk());
  ASSERT_THAT(client.PullForStep(2, {0}, dst).status(), IsOk());
  ZO_ASSERT_OK_AND_ASSIGN(const v1::JobStatus before, client.JobStatus());

  // Step 3's weights (version 2) are prefetched while step 2 is pushed.
  absl::StatusOr<bool> prefetched;
  std::thread prefetch([&] { prefetched = client.PullForStep(3, {0}, dst); });
  EXPECT_TRUE(JobStatusUntil(client, [](const v1::JobStatus& st) {
    return st.waiting_pulls() == 1;
  })) << "the prefetch never waited for version 2";
  // The first half's chunks are speculated (and written into the
  // prefetch's places) before the second half's infinity skips the step.
  // (No fatal assertion before the join.)
  absl::Status pushed = client.PushRange(2, 0, 0, bytes(0, kSkippedElems / 2));
  EXPECT_TRUE(pushed.ok() && JobStatusUntil(client,
                                            [&](const v1::JobStatus& st) {
                                              return st.speculated_chunks() ==
                                                     before.speculated_chunks() + 2;
                                            }))
      << "step 2's first chunks were never speculated";
  g[kSkippedElems - 1] = FloatToHalfBits(std::numeric_limits<float>::infinity());
  if (pushed.ok()) {
    pushed = client.PushRange(2, 0, kSkippedElems / 2, bytes(kSkippedElems / 2, kSkippedElems));
  }
  const absl::Status finished = pushed.ok() ? client.FinishStep(2) : pushed;
  prefetch.join();
  ASSERT_THAT(finished, IsOk());
  ASSERT_THAT(prefetched.status(), IsOk());
  ZO_ASSERT_OK_AND_ASSIGN(const v1::JobStatus status, client.JobStatus());
  EXPECT_TRUE(status.last_skipped());
  EXPECT_GE(status.redone_chunks(), before.redone_chunks() + 2);

  std::vector<std::byte> version2(w.size());
  const std::vector<absl::Span<std::byte>> whole = {absl::MakeSpan(version2)};
  ASSERT_THAT(client.Pull(2, -1, {0}, whole).status(), IsOk());
  EXPECT_TRUE(std::equal(w.begin(), w.end(), version2.begin()))
      << "the prefetch kept weights of the dropped speculation";
}

}  // namespace zo::testing

#endif  // ZO_TESTS_SERVER_SKIPPED_PREFETCH_H_
