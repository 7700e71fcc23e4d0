// tools/loadtest/arrivals.h — when each request of a load test is sent.
//
// Gaps between requests are Gamma(shape = burstiness, scale = 1 / (rate ·
// burstiness)): mean 1/rate at every burstiness, variance 1 / (rate² ·
// burstiness). Burstiness 1 is a Poisson process; below 1 burstier, above 1
// more regular. An infinite rate sends everything at time 0.
#pragma once

#include <cstdint>
#include <vector>

#include "common/status.h"

namespace baton::loadtest {

struct ArrivalOptions {
  double request_rate = 1.0;  // requests per second; +inf: all at once
  double burstiness = 1.0;
  uint64_t seed = 0;
};

// Send times in seconds from the start, nondecreasing, one per request.
// Deterministic for a seed: std::mt19937_64 bits turned into gamma draws by
// Baton's own sampler, so every platform gets the same schedule.
Result<std::vector<double>> arrival_times(int64_t num_requests, const ArrivalOptions& options);

}  // namespace baton::loadtest
