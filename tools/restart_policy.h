// tools/restart_policy.h — when `baton up` starts a role again that exited
// on its own: after a delay that doubles with each exit in a row (first
// 1 s, at most 30 s), never more than max_restarts times in a row; a role
// that then ran healthy (a node registered, the router answering) for
// `healthy_after` has its count reset, so a crash a day is always restarted
// but a role that cannot start is given up, however long its tries take.
#pragma once

#include <chrono>
#include <map>
#include <optional>
#include <string>

namespace baton::tools {

class RestartPolicy {
 public:
  using Clock = std::chrono::steady_clock;

  struct Limits {
    int max_restarts = 5;  // in a row; 0: never restart
    std::chrono::milliseconds first_delay{1000};
    std::chrono::milliseconds max_delay{30000};
    std::chrono::milliseconds healthy_after{60000};
  };

  explicit RestartPolicy(Limits limits) : limits_(limits) {}

  // `role` exited at `now`, its run healthy since `healthy_since` (nullopt:
  // never seen healthy): how long to wait before starting it again, or
  // nullopt when it has had all its restarts.
  std::optional<std::chrono::milliseconds> on_exit(const std::string& role,
                                                   std::optional<Clock::time_point> healthy_since,
                                                   Clock::time_point now);
  // Restarts in a row `role` has had so far.
  int restarts(const std::string& role) const;
  int max_restarts() const { return limits_.max_restarts; }

 private:
  Limits limits_;
  std::map<std::string, int> in_a_row_;
};

}  // namespace baton::tools
