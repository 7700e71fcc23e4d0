// A node's registration against the RegisterAcks a router sends: a welcome
// registers it; "register again" for a heartbeat of its current
// registration loses it, once; the same answer arriving again while it
// registers anew, or one for a registration it has since replaced, is
// stale and changes nothing.
#include "common/node_registration.h"

#include <gtest/gtest.h>

#include <random>

namespace baton::control {
namespace {

RegisterAck again(uint64_t registration) {
  return RegisterAck{false, "unknown or down node 'decode-0': register again", registration};
}

TEST(NodeRegistrationTest, OnlyAnAnswerToTheCurrentRegistrationLosesIt) {
  std::mt19937_64 rng(std::random_device{}());
  const uint64_t first = 1 + rng() % (uint64_t(1) << 62), second = first + 1 + rng() % 5;
  NodeRegistration registration;
  EXPECT_FALSE(registration.registered());
  EXPECT_EQ(registration.number(), 0u);

  auto welcome = registration.on_ack(RegisterAck{true, "welcome", first});
  EXPECT_TRUE(welcome.welcomed);
  EXPECT_FALSE(welcome.lost);
  EXPECT_TRUE(registration.registered());
  EXPECT_EQ(registration.number(), first);

  // Declared dead: the first answer to a heartbeat loses the registration.
  auto lost = registration.on_ack(again(first));
  EXPECT_TRUE(lost.lost);
  EXPECT_TRUE(lost.refused);
  EXPECT_FALSE(registration.registered());
  // More heartbeats sent before the node knew: already registering again.
  for (int i = 0; i < 3; ++i) {
    auto stale = registration.on_ack(again(first));
    EXPECT_FALSE(stale.lost) << "a second Register would read as a restart";
    EXPECT_FALSE(stale.refused);
  }
  auto back = registration.on_ack(RegisterAck{true, "welcome", second});
  EXPECT_TRUE(back.welcomed);
  EXPECT_EQ(registration.number(), second);
  // One that crossed the new registration counts for nothing.
  auto crossed = registration.on_ack(again(first));
  EXPECT_FALSE(crossed.lost);
  EXPECT_FALSE(crossed.refused);
  EXPECT_TRUE(registration.registered());
  // The new one's own does.
  EXPECT_TRUE(registration.on_ack(again(second)).lost);
}

// A refused Register, or a router that numbers no registrations, names
// none: each such answer counts, as before registrations had numbers. Only
// a lost registration asks for a Register at once; a refused one waits for
// the retry timer (a node the router keeps refusing does not flood it).
TEST(NodeRegistrationTest, AnAnswerNamingNoRegistrationAlwaysCounts) {
  NodeRegistration registration;
  auto refused = registration.on_ack(RegisterAck{false, "node 'decode-0' has KV block size 8"});
  EXPECT_TRUE(refused.refused);
  EXPECT_FALSE(refused.lost);
  EXPECT_TRUE(registration.on_ack(RegisterAck{false, "again"}).refused);
  ASSERT_TRUE(registration.on_ack(RegisterAck{true, "welcome"}).welcomed);
  EXPECT_EQ(registration.number(), 0u);
  auto lost = registration.on_ack(again(0));
  EXPECT_TRUE(lost.lost);
  EXPECT_TRUE(lost.refused);
  EXPECT_FALSE(registration.registered());
}

}  // namespace
}  // namespace baton::control
