#include "tools/restart_policy.h"

#include <algorithm>

namespace baton::tools {

std::optional<std::chrono::milliseconds> RestartPolicy::on_exit(
    const std::string& role, std::optional<Clock::time_point> healthy_since,
    Clock::time_point now) {
  int& count = in_a_row_[role];
  if (healthy_since && now - *healthy_since >= limits_.healthy_after) count = 0;
  if (count >= limits_.max_restarts) return std::nullopt;
  std::chrono::milliseconds delay = limits_.first_delay;
  for (int i = 0; i < count && delay < limits_.max_delay; ++i) delay *= 2;
  ++count;
  return std::min(delay, limits_.max_delay);
}

int RestartPolicy::restarts(const std::string& role) const {
  auto it = in_a_row_.find(role);
  return it == in_a_row_.end() ? 0 : it->second;
}

}  // namespace baton::tools
