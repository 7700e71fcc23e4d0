// bench/stats.h — "min" and "max" statistics for --benchmark_repetitions: on a
// machine shared with other work, the fastest repetition (min time, max rate
// counters) is the best estimate of what the kernel itself can do; slower ones
// were preempted.
#pragma once

#include <algorithm>
#include <vector>

namespace baton::bench {

inline double min_of(const std::vector<double>& v) {
  return v.empty() ? 0.0 : *std::min_element(v.begin(), v.end());
}

inline double max_of(const std::vector<double>& v) {
  return v.empty() ? 0.0 : *std::max_element(v.begin(), v.end());
}

}  // namespace baton::bench
