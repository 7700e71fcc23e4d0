// The request workers: the bound on waiting bytes, every queued task run
// before stop() returns, work posted after it run by the caller, and a task
// that throws leaving its thread serving the next.
#include "router/request_workers.h"

#include <gtest/gtest.h>

#include <atomic>
#include <future>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

namespace baton::router {
namespace {

constexpr auto kQueued = RequestWorkers::Admission::kQueued;

// Holds a one-thread pool's thread until release(), so that what is posted
// meanwhile stays queued.
class HeldThread {
 public:
  explicit HeldThread(RequestWorkers& workers) {
    EXPECT_EQ(workers.try_post(0,
                               [this] {
                                 started_.set_value();
                                 opened_.wait();
                               }),
              kQueued);
    started_.get_future().wait();
  }
  void release() { gate_.set_value(); }

 private:
  std::promise<void> gate_;
  std::shared_future<void> opened_ = gate_.get_future().share();
  std::promise<void> started_;
};

TEST(RequestWorkersTest, RefusesRequestsPastTheQueuedBytesButAlwaysOneAlone) {
  std::mt19937 rng(std::random_device{}());
  const size_t bound = 1000 + rng() % 1000;
  RequestWorkers workers(1, bound);
  HeldThread held(workers);
  std::atomic<int> ran{0};
  // Alone, a request larger than the bound gets in...
  ASSERT_EQ(workers.try_post(bound + 1, [&] { ++ran; }), kQueued);
  EXPECT_EQ(workers.queued_bytes(), bound + 1);
  // ...and nothing more while it waits.
  EXPECT_EQ(workers.try_post(1, [&] { ADD_FAILURE() << "a refused task ran"; }),
            RequestWorkers::Admission::kFull);
  // Work owed to admitted requests is never refused.
  workers.post([&] { ++ran; });
  held.release();
  workers.stop();
  EXPECT_EQ(ran.load(), 2);
  EXPECT_EQ(workers.queued_bytes(), 0u);

  // Under the bound, requests queue until the next would pass it.
  RequestWorkers second(1, bound);
  HeldThread held_second(second);
  const size_t each = bound / 3;
  int admitted = 0;
  while (second.try_post(each, [&] { ++ran; }) == kQueued) ++admitted;
  EXPECT_EQ(admitted, 3);
  EXPECT_EQ(second.queued_bytes(), 3 * each);
  held_second.release();
  second.stop();
  EXPECT_EQ(ran.load(), 5);
}

TEST(RequestWorkersTest, StopRunsWhatIsQueuedAndLaterWorkRunsOnTheCaller) {
  std::atomic<int> ran{0};
  const int tasks = 200 + int(std::random_device{}() % 200);
  RequestWorkers workers(3, size_t(1) << 30);
  for (int i = 0; i < tasks; ++i) ASSERT_EQ(workers.try_post(10, [&] { ++ran; }), kQueued);
  workers.stop();
  EXPECT_EQ(ran.load(), tasks);
  workers.stop();  // idempotent
  EXPECT_EQ(workers.try_post(1, [&] { ADD_FAILURE() << "ran after stop"; }),
            RequestWorkers::Admission::kStopped);
  const std::thread::id caller = std::this_thread::get_id();
  std::thread::id ran_on;
  workers.post([&] { ran_on = std::this_thread::get_id(); });
  EXPECT_EQ(ran_on, caller);
}

TEST(RequestWorkersTest, ATaskThatThrowsLeavesItsThreadServing) {
  RequestWorkers workers(1, 1 << 20);
  std::promise<int> next;
  ASSERT_EQ(workers.try_post(1, [] { throw std::runtime_error("a broken route"); }), kQueued);
  ASSERT_EQ(workers.try_post(1, [] { throw 42; }), kQueued);
  ASSERT_EQ(workers.try_post(1, [&] { next.set_value(7); }), kQueued);
  auto value = next.get_future();
  ASSERT_EQ(value.wait_for(std::chrono::seconds(10)), std::future_status::ready);
  EXPECT_EQ(value.get(), 7);
}

// Replies owed to admitted requests go before requests still waiting, and
// the pool is idle only once the last task has finished running.
TEST(RequestWorkersTest, RepliesRunBeforeWaitingRequestsAndIdleMeansDone) {
  RequestWorkers workers(1, 1 << 20);
  EXPECT_TRUE(workers.idle());
  HeldThread held(workers);
  EXPECT_FALSE(workers.idle());    // running
  std::vector<std::string> order;  // the one thread only
  const int requests = 2 + int(std::random_device{}() % 5);
  for (int i = 0; i < requests; ++i) {
    ASSERT_EQ(workers.try_post(1, [&] { order.push_back("request"); }), kQueued);
  }
  workers.post([&] { order.push_back("reply"); });
  std::promise<void> last_started, last_may_end;
  std::shared_future<void> may_end = last_may_end.get_future().share();
  ASSERT_EQ(workers.try_post(1,
                             [&] {
                               last_started.set_value();
                               may_end.wait();
                             }),
            kQueued);
  held.release();
  last_started.get_future().wait();
  EXPECT_FALSE(workers.idle()) << "the last task is still running";
  last_may_end.set_value();
  workers.stop();
  EXPECT_TRUE(workers.idle());
  ASSERT_EQ(order.size(), size_t(requests) + 1);
  EXPECT_EQ(order.front(), "reply");
}

}  // namespace
}  // namespace baton::router
