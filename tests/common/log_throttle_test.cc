// LogThrottle: the first occurrence and one an interval later are logged,
// with the count of those in between.
#include "common/log_throttle.h"

#include <gtest/gtest.h>

#include <random>

namespace baton {
namespace {

using namespace std::chrono_literals;

TEST(LogThrottleTest, OneLineAnIntervalCountingTheRest) {
  const uint64_t seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  LogThrottle throttle(1s);
  LogThrottle::Clock::time_point now{};  // the clock's epoch: the first must log anyway
  uint64_t unlogged = 99;
  ASSERT_TRUE(throttle.should_log(&unlogged, now));
  EXPECT_EQ(unlogged, 0u);
  for (int round = 0; round < 20; ++round) {
    const uint64_t quiet = rng() % 50;
    for (uint64_t i = 0; i < quiet; ++i) {
      now += 999ms / (quiet + 1);  // all within the interval
      ASSERT_FALSE(throttle.should_log(&unlogged, now)) << "round " << round << " event " << i;
    }
    now += 1s;
    ASSERT_TRUE(throttle.should_log(&unlogged, now)) << "round " << round;
    EXPECT_EQ(unlogged, quiet) << "round " << round;
  }
}

}  // namespace
}  // namespace baton
