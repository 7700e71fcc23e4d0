// UniqueFd closes exactly what it owns, once.
#include "common/unique_fd.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

namespace baton {
namespace {

bool is_open(int fd) { return ::fcntl(fd, F_GETFD) != -1; }

TEST(UniqueFd, ClosesWhatItOwnsOnceAndHandsItOver) {
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  const int read_end = fds[0], write_end = fds[1];
  {
    UniqueFd owner(read_end);
    EXPECT_TRUE(owner.valid());
    UniqueFd moved(std::move(owner));
    EXPECT_FALSE(owner.valid());  // NOLINT: the moved-from owner holds nothing
    EXPECT_EQ(moved.get(), read_end);
    UniqueFd assigned;
    assigned = std::move(moved);
    EXPECT_EQ(assigned.get(), read_end);
    EXPECT_TRUE(is_open(read_end));
  }
  EXPECT_FALSE(is_open(read_end));  // closed when its last owner went

  UniqueFd writer(write_end);
  const int released = writer.release();
  EXPECT_FALSE(writer.valid());
  EXPECT_TRUE(is_open(released));  // released, not closed
  writer.reset(released);
  writer.reset();
  EXPECT_FALSE(is_open(write_end));
}

}  // namespace
}  // namespace baton
