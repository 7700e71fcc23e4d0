// RestartPolicy: the delays `baton up` waits before starting a role again.
#include "tools/restart_policy.h"

#include <gtest/gtest.h>

#include <random>

namespace baton::tools {
namespace {

using std::chrono::milliseconds;
using Clock = RestartPolicy::Clock;

TEST(RestartPolicyTest, DelaysDoubleUpToTheCapThenTheRoleIsGivenUp) {
  RestartPolicy policy({.max_restarts = 7,
                        .first_delay = milliseconds(100),
                        .max_delay = milliseconds(1000),
                        .healthy_after = milliseconds(60000)});
  Clock::time_point now = Clock::now();
  const milliseconds want[] = {milliseconds(100), milliseconds(200),  milliseconds(400),
                               milliseconds(800), milliseconds(1000), milliseconds(1000),
                               milliseconds(1000)};
  for (milliseconds expected : want) {
    const Clock::time_point started = now;
    now += milliseconds(50);  // it ran 50 ms, far from healthy
    EXPECT_EQ(policy.on_exit("decode-0", started, now), expected);
    now += expected;
  }
  EXPECT_EQ(policy.restarts("decode-0"), 7);
  EXPECT_EQ(policy.on_exit("decode-0", now, now + milliseconds(1)), std::nullopt);
  EXPECT_EQ(policy.on_exit("decode-0", now, now + milliseconds(1)), std::nullopt);
}

TEST(RestartPolicyTest, ARoleThatRanLongEnoughStartsOverAndRolesCountApart) {
  std::mt19937 rng{std::random_device{}()};
  const int max = 1 + int(rng() % 6);
  RestartPolicy policy({.max_restarts = max,
                        .first_delay = milliseconds(10),
                        .max_delay = milliseconds(10000),
                        .healthy_after = milliseconds(500)});
  Clock::time_point now = Clock::now();
  for (int i = 0; i < max; ++i) ASSERT_TRUE(policy.on_exit("router", now, now).has_value());
  EXPECT_EQ(policy.on_exit("router", now, now), std::nullopt) << "max " << max;
  // Another role has restarts of its own.
  EXPECT_EQ(policy.on_exit("prefill-0", now, now), milliseconds(10));
  // After a healthy run, the first delay again.
  EXPECT_EQ(policy.on_exit("router", now, now + milliseconds(500)), milliseconds(10));
  EXPECT_EQ(policy.restarts("router"), 1);
}

// A role that never came up (a node that loads for minutes and then fails
// before registering) is given up however long each try ran: only a
// healthy run starts the count over.
TEST(RestartPolicyTest, LongRunsThatNeverCameUpStillCountTowardsGivingUp) {
  RestartPolicy policy({.max_restarts = 3,
                        .first_delay = milliseconds(10),
                        .max_delay = milliseconds(100),
                        .healthy_after = milliseconds(500)});
  Clock::time_point now = Clock::now();
  for (int i = 0; i < 3; ++i) {
    now += milliseconds(5000);  // ten times healthy_after, never healthy
    ASSERT_TRUE(policy.on_exit("decode-0", std::nullopt, now).has_value()) << i;
  }
  EXPECT_EQ(policy.on_exit("decode-0", std::nullopt, now + milliseconds(5000)), std::nullopt);
  // Healthy, but not long enough: no reset either.
  RestartPolicy brief({.max_restarts = 1, .healthy_after = milliseconds(500)});
  ASSERT_TRUE(brief.on_exit("router", now, now).has_value());
  EXPECT_EQ(brief.on_exit("router", now, now + milliseconds(499)), std::nullopt);
}

TEST(RestartPolicyTest, NoRestartsMeansNone) {
  RestartPolicy policy({.max_restarts = 0});
  const Clock::time_point now = Clock::now();
  EXPECT_EQ(policy.on_exit("decode-0", now, now + std::chrono::hours(1)), std::nullopt);
}

}  // namespace
}  // namespace baton::tools
