// common/log_throttle.h — at most one log line per interval for an event a
// peer can repeat at will (a client's malformed messages), so that it cannot
// fill the log as fast as it sends; the line says how many went unlogged.
#pragma once

#include <chrono>
#include <cstdint>

namespace baton {

class LogThrottle {
 public:
  using Clock = std::chrono::steady_clock;
  explicit LogThrottle(Clock::duration interval = std::chrono::seconds(1)) : interval_(interval) {}

  // Whether this occurrence is to be logged (the first, and then the first
  // one an interval after the last logged); `*unlogged` is set to how many
  // occurrences since that one were not. Not thread-safe: one per thread.
  bool should_log(uint64_t* unlogged, Clock::time_point now = Clock::now()) {
    if (logged_once_ && now - last_logged_ < interval_) {
      ++unlogged_;
      return false;
    }
    *unlogged = unlogged_;
    unlogged_ = 0;
    logged_once_ = true;
    last_logged_ = now;
    return true;
  }

 private:
  Clock::duration interval_;
  Clock::time_point last_logged_{};
  bool logged_once_ = false;
  uint64_t unlogged_ = 0;
};

}  // namespace baton
