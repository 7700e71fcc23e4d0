#include <gtest/gtest.h>

#include <thread>

#include <algorithm>
#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "kernels/cpu/parallel.h"
#include "kernels/cpu/thread_pool.h"

namespace baton::kernels::cpu {
namespace {

TEST(ThreadPoolTest, VisitsEveryIndexExactlyOnceInContiguousChunks) {
  for (int threads : {1, 2, 3, 5}) {
    ThreadPool pool(threads);
    EXPECT_EQ(pool.size(), threads);
    for (int64_t n : {0, 1, 2, 3, 4, 5, 7, 64, 1000, 100003}) {
      SCOPED_TRACE("threads=" + std::to_string(threads) + " n=" + std::to_string(n));
      auto visits = std::make_unique<std::atomic<int>[]>(size_t(n) + 1);
      std::atomic<int> calls{0};
      // A thread index is never running two chunks at once (kernels key
      // per-thread scratch on it).
      std::vector<std::atomic<int>> busy(static_cast<size_t>(threads));
      pool.parallel_for(n, [&](int64_t begin, int64_t end, int t) {
        ASSERT_LE(0, begin);
        ASSERT_LT(begin, end);
        ASSERT_LE(end, n);
        ASSERT_GE(t, 0);
        ASSERT_LT(t, threads);
        ASSERT_EQ(busy[size_t(t)]++, 0) << "thread index " << t << " used twice at once";
        calls++;
        for (int64_t i = begin; i < end; ++i) visits[size_t(i)]++;
        busy[size_t(t)]--;
      });
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(visits[size_t(i)].load(), 1) << "index " << i;
      EXPECT_LE(calls.load(), threads);
      EXPECT_EQ(calls.load(), n == 0 ? 0 : int(std::min<int64_t>(n, threads)));
    }
  }
}

// The pieces a parallel loop over [0, n) ran, sorted by where they begin, and
// the thread each ran on; checks every piece is inside [0, n), on a thread of
// the pool, and that every index was visited exactly once.
struct Pieces {
  std::vector<std::pair<int64_t, int64_t>> ranges;  // (begin, end)
  std::vector<int> threads;                         // in the order they ran
};
template <typename Loop>
Pieces run_and_record(int threads, int64_t n, Loop&& loop) {
  auto visits = std::make_unique<std::atomic<int>[]>(size_t(n) + 1);
  std::mutex mutex;
  Pieces pieces;
  loop([&](int64_t begin, int64_t end, int t) {
    ASSERT_LE(0, begin);
    ASSERT_LT(begin, end);
    ASSERT_LE(end, n);
    ASSERT_LT(t, threads);
    for (int64_t i = begin; i < end; ++i) visits[size_t(i)]++;
    std::lock_guard lock(mutex);
    pieces.ranges.emplace_back(begin, end);
    pieces.threads.push_back(t);
  });
  for (int64_t i = 0; i < n; ++i) EXPECT_EQ(visits[size_t(i)].load(), 1) << "index " << i;
  std::sort(pieces.ranges.begin(), pieces.ranges.end());
  return pieces;
}

// Too little work for two threads (under min_share each) must run as one call
// on the caller: checks that it did when it should have; true in that case.
bool ran_inline_as_expected(const Pieces& run, int threads, int64_t n, int64_t min_share) {
  if (std::min<int64_t>(threads, n / min_share) > 1) return false;
  EXPECT_EQ(run.ranges, (std::vector<std::pair<int64_t, int64_t>>{{0, n}}))
      << "not run inline in one call";
  EXPECT_EQ(run.threads, std::vector<int>{0});
  return true;
}

// parallel_dynamic: every index once; too little work for two threads runs
// inline; otherwise pieces start on the alignment, hold no more than about
// `grain`, are even (no two differ by a group or more, the last piece's short
// tail aside) and, unless there are fewer groups, as many as a multiple of the
// threads sharing the work.
TEST(ParallelDynamicTest, EvenAlignedPiecesCoverEveryIndexOnce) {
  for (int threads : {1, 2, 3}) {
    ThreadPool pool(threads);
    for (int64_t n : {0, 1, 5, 10, 64, 192, 576, 1000, 4864}) {
      for (int64_t grain : {1, 5, 64, 256, 5000}) {
        for (int64_t align : {1, 4}) {
          for (int64_t min_share : {1, 100}) {
            SCOPED_TRACE("threads=" + std::to_string(threads) + " n=" + std::to_string(n) +
                         " grain=" + std::to_string(grain) + " align=" + std::to_string(align) +
                         " min_share=" + std::to_string(min_share));
            const Pieces run = run_and_record(threads, n, [&](auto&& record) {
              parallel_dynamic(pool, n, grain, align, min_share, record);
            });
            if (n == 0 || ran_inline_as_expected(run, threads, n, min_share)) continue;
            std::vector<int64_t> sizes;
            for (auto [begin, end] : run.ranges) {
              EXPECT_EQ(begin % align, 0) << "piece at " << begin;
              sizes.push_back(end - begin);
            }
            const int64_t sharing = std::min<int64_t>(threads, n / min_share);
            const int64_t groups = (n + align - 1) / align;
            const int64_t pieces = int64_t(sizes.size());
            EXPECT_TRUE(pieces % sharing == 0 || pieces == groups) << pieces << " pieces";
            auto [lo, hi] = std::minmax_element(sizes.begin(), sizes.end());
            EXPECT_LT(*hi - *lo, 2 * align) << "pieces of " << *lo << " to " << *hi;
            EXPECT_LT(*hi, grain + 2 * align) << "a piece of " << *hi;
          }
        }
      }
    }
  }
}

// parallel_guided: every index once; too little work for two threads runs
// inline; otherwise pieces start on the alignment, hold between min_piece and
// max_piece elements (rounded up to the alignment; only the last may be
// shorter), and never grow: each takes a share of what is left.
TEST(ParallelGuidedTest, ShrinkingAlignedPiecesCoverEveryIndexOnce) {
  for (int threads : {1, 2, 3}) {
    ThreadPool pool(threads);
    for (int64_t n : {0, 1, 5, 10, 64, 192, 960, 3072, 49152}) {
      for (auto [min_piece, max_piece] : {std::pair<int64_t, int64_t>{1, 1}, {16, 128}, {5, 64}}) {
        for (int64_t align : {1, 4}) {
          for (int64_t min_share : {1, 100}) {
            SCOPED_TRACE("threads=" + std::to_string(threads) + " n=" + std::to_string(n) +
                         " pieces=" + std::to_string(min_piece) + ".." + std::to_string(max_piece) +
                         " align=" + std::to_string(align) +
                         " min_share=" + std::to_string(min_share));
            const Pieces run = run_and_record(threads, n, [&](auto&& record) {
              parallel_guided(pool, n, min_piece, max_piece, align, min_share, record);
            });
            if (n == 0 || ran_inline_as_expected(run, threads, n, min_share)) continue;
            auto round_up = [&](int64_t x) { return (x + align - 1) / align * align; };
            int64_t previous = max_piece + align;
            for (auto [begin, end] : run.ranges) {
              const int64_t size = end - begin;
              EXPECT_EQ(begin % align, 0) << "piece at " << begin;
              EXPECT_LE(size, std::max(round_up(min_piece), round_up(max_piece)));
              if (end < n) {
                EXPECT_GE(size, round_up(min_piece)) << "piece at " << begin;
                EXPECT_LE(size, previous) << "piece at " << begin << " grew";
              }
              previous = size;
            }
          }
        }
      }
    }
  }
}

TEST(ThreadPoolTest, ManyBackToBackJobs) {
  ThreadPool pool(2);
  std::atomic<int64_t> total{0};
  for (int job = 0; job < 2000; ++job)
    pool.parallel_for(10, [&](int64_t b, int64_t e, int) { total += e - b; });
  EXPECT_EQ(total.load(), 20000);
}

TEST(ThreadPoolTest, DefaultSizeIsHardwareThreads) {
  const int hardware = int(std::max(1u, std::thread::hardware_concurrency()));
  EXPECT_EQ(ThreadPool().size(), hardware);
  EXPECT_EQ(ThreadPool(0).size(), hardware);
  EXPECT_EQ(ThreadPool(1).size(), 1);
}

// A product below 2^-126 comes out as zero on every thread of a pool (the
// caller's chunks included), and the caller's own setting is back when
// parallel_for returns.
TEST(ThreadPoolTest, FlushesSubnormalsOnItsThreadsOnly) {
#if !defined(__x86_64__) && !defined(__i386__)
  GTEST_SKIP() << "subnormals are flushed on x86 only";
#endif
  volatile float tiny = 1e-30f, small = 1e-10f;  // their product, 1e-40, is subnormal
  ASSERT_NE(tiny * small, 0.0f) << "the test thread already flushes subnormals";
  for (int threads : {1, 2, 3}) {
    SCOPED_TRACE("threads=" + std::to_string(threads));
    ThreadPool pool(threads);
    for (int64_t n : {1, 64}) {
      std::vector<float> products(size_t(n), -1.0f);
      std::vector<int> ran_on(size_t(n), -1);
      pool.parallel_for(n, [&](int64_t b, int64_t e, int t) {
        for (int64_t i = b; i < e; ++i) {
          products[size_t(i)] = tiny * small;
          ran_on[size_t(i)] = t;
        }
      });
      for (int64_t i = 0; i < n; ++i)
        EXPECT_EQ(products[size_t(i)], 0.0f) << "index " << i << " on thread " << ran_on[size_t(i)];
      EXPECT_NE(tiny * small, 0.0f) << "the caller's setting was not restored";
    }
  }
}

}  // namespace
}  // namespace baton::kernels::cpu
