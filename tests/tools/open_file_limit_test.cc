// raise_open_file_limit against the process's own RLIMIT_NOFILE.
#include "tools/open_file_limit.h"

#include <gtest/gtest.h>
#include <sys/resource.h>

namespace baton::tools {
namespace {

rlimit current() {
  rlimit limit{};
  EXPECT_EQ(getrlimit(RLIMIT_NOFILE, &limit), 0);
  return limit;
}

// Starting from a low soft limit: raised to what is wanted, never lowered,
// and as far as the hard limit goes when that is lower (an error naming it).
TEST(OpenFileLimitTest, RaisesTheSoftLimitAsFarAsTheHardOneGoes) {
  const rlimit original = current();
  if (original.rlim_max != RLIM_INFINITY && original.rlim_max < 512)
    GTEST_SKIP() << "a hard limit of " << original.rlim_max << " leaves nothing to test";
  rlimit low = original;
  low.rlim_cur = 256;
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &low), 0);

  EXPECT_TRUE(raise_open_file_limit(400).is_ok());
  EXPECT_EQ(current().rlim_cur, 400u);
  EXPECT_TRUE(raise_open_file_limit(300).is_ok());
  EXPECT_EQ(current().rlim_cur, 400u) << "lowered";
  if (original.rlim_max != RLIM_INFINITY) {
    const Status beyond = raise_open_file_limit(uint64_t(original.rlim_max) + 1);
    EXPECT_EQ(beyond.code(), StatusCode::kResourceExhausted) << beyond.to_string();
    EXPECT_NE(beyond.message().find(std::to_string(original.rlim_max)), std::string::npos)
        << beyond.message();
    EXPECT_EQ(current().rlim_cur, original.rlim_max);
  }
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &original), 0);
}

}  // namespace
}  // namespace baton::tools
