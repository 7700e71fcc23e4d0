// bench/manual_time.h — a kernel call timed as one iteration's manual time
// (->UseManualTime()), so what a benchmark does between calls (a ceiling's
// pass, rotating inputs) stays out of its rate.
#pragma once

#include <benchmark/benchmark.h>

#include <chrono>

namespace baton::bench {

// Runs `call`, sets its duration as this iteration's time, adds it to
// `total_seconds` and returns it.
template <typename Call>
double time_iteration(benchmark::State& state, double& total_seconds, Call&& call) {
  const auto start = std::chrono::steady_clock::now();
  call();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  state.SetIterationTime(seconds);
  total_seconds += seconds;
  return seconds;
}

}  // namespace baton::bench
