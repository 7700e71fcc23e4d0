// tests/engine/io_uring_probe.h — whether this kernel offers io_uring, asked
// of the kernel directly rather than through the SSD tier under test: a tier
// that falls back to plain reads when it need not must fail, not skip.
#pragma once

#include <liburing.h>

namespace baton::engine::testing {

inline bool kernel_offers_io_uring() {
  io_uring ring;
  const int rc = io_uring_queue_init(4, &ring, 0);
  if (rc == 0) io_uring_queue_exit(&ring);
  return rc == 0;
}

}  // namespace baton::engine::testing
