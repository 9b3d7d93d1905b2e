#include "offload/thread_pool.h"

#include <atomic>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace zo {
namespace {

TEST(ThreadPoolTest, DefaultSizeIsHardwareConcurrency) {
  ThreadPool pool;
  EXPECT_EQ(pool.size(), ThreadPool::DefaultSize());
  EXPECT_GE(pool.size(), 1);
  EXPECT_EQ(ThreadPool(-3).size(), ThreadPool::DefaultSize());
}

class ThreadPoolSizeTest : public ::testing::TestWithParam<int> {};

TEST_P(ThreadPoolSizeTest, EveryWorkerRunsExactlyOncePerCall) {
  const int n = GetParam();
  ThreadPool pool(n);
  ASSERT_EQ(pool.size(), n);
  // Plain ints: each slot has one writer per call, and the caller reads them
  // after RunOnAll returns, which must order the accesses (TSan checks).
  std::vector<int> runs(n, 0);
  std::vector<int> last_call(n, -1);
  constexpr int kCalls = 2000;
  for (int call = 0; call < kCalls; ++call) {
    pool.RunOnAll([&](int w) {
      ASSERT_GE(w, 0);
      ASSERT_LT(w, n);
      ++runs[w];
      last_call[w] = call;
    });
    for (int w = 0; w < n; ++w) ASSERT_EQ(last_call[w], call) << "worker " << w;
  }
  EXPECT_THAT(runs, ::testing::Each(kCalls));
}

TEST_P(ThreadPoolSizeTest, WorkerZeroIsTheCallerAndOthersAreDistinctThreads) {
  const int n = GetParam();
  ThreadPool pool(n);
  for (int call = 0; call < 10; ++call) {
    std::vector<std::thread::id> ids(n);
    pool.RunOnAll([&](int w) { ids[w] = std::this_thread::get_id(); });
    EXPECT_EQ(ids[0], std::this_thread::get_id());
    EXPECT_EQ(std::set<std::thread::id>(ids.begin(), ids.end()).size(), static_cast<size_t>(n));
  }
}

TEST_P(ThreadPoolSizeTest, WorkersSeeWhatTheCallerWroteBefore) {
  const int n = GetParam();
  ThreadPool pool(n);
  std::vector<int> input(n), output(n);
  for (int call = 0; call < 500; ++call) {
    for (int w = 0; w < n; ++w) input[w] = call * 7 + w;
    pool.RunOnAll([&](int w) { output[w] = input[w] + 1; });
    for (int w = 0; w < n; ++w) ASSERT_EQ(output[w], call * 7 + w + 1);
  }
}

INSTANTIATE_TEST_SUITE_P(Sizes, ThreadPoolSizeTest, ::testing::Values(1, 2, 3, 4, 8),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return "Threads" + std::to_string(info.param);
                         });

TEST(ThreadPoolTest, ConcurrentCallersAreSerialized) {
  for (int n : {1, 3}) {
    ThreadPool pool(n);
    std::atomic<int> inside{0};
    std::atomic<int> total{0};
    std::atomic<bool> overlapped{false};
    auto caller = [&] {
      for (int i = 0; i < 300; ++i) {
        pool.RunOnAll([&](int) {
          if (inside.fetch_add(1) >= n) overlapped = true;
          total.fetch_add(1);
          inside.fetch_sub(1);
        });
      }
    };
    std::thread a(caller), b(caller);
    a.join();
    b.join();
    EXPECT_FALSE(overlapped.load()) << n << " workers";
    EXPECT_EQ(total.load(), 2 * 300 * n);
  }
}

TEST(ThreadPoolTest, DestroysIdlePoolsCleanly) {
  for (int i = 0; i < 50; ++i) {
    auto never_used = std::make_unique<ThreadPool>(4);
    never_used.reset();
    ThreadPool used(3);
    int sum = 0;
    std::vector<int> parts(3);
    used.RunOnAll([&](int w) { parts[w] = w; });
    for (int p : parts) sum += p;
    EXPECT_EQ(sum, 3);
  }
}

TEST(ThreadPoolTest, LongRunningWorkerIsWaitedFor) {
  ThreadPool pool(2);
  std::vector<int> done(2, 0);
  std::atomic<bool> first_done{false};
  pool.RunOnAll([&](int w) {
    // Worker 1 ends last: it starts its part only once worker 0 has ended.
    if (w == 1) {
      while (!first_done.load()) std::this_thread::yield();
    }
    done[w] = 1;
    if (w == 0) first_done = true;
  });
  EXPECT_THAT(done, ::testing::Each(1));
}

}  // namespace
}  // namespace zo
