#include "tools/loadtest/arrivals.h"

#include <cmath>
#include <limits>
#include <random>
#include <string>

namespace baton::loadtest {
namespace {

// Uniform in (0, 1) from the top 53 bits: identical on every platform, unlike
// the standard distributions whose algorithms are implementation-defined.
double uniform_open(std::mt19937_64& rng) {
  return (double(rng() >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}

double standard_normal(std::mt19937_64& rng) {
  // Box-Muller; one of the pair is enough here.
  const double u1 = uniform_open(rng), u2 = uniform_open(rng);
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
}

// Marsaglia and Tsang's method for Gamma(shape, 1); shape < 1 via the boost
// Gamma(shape + 1) · U^(1/shape).
double standard_gamma(std::mt19937_64& rng, double shape) {
  if (shape < 1.0) {
    return standard_gamma(rng, shape + 1.0) * std::pow(uniform_open(rng), 1.0 / shape);
  }
  const double d = shape - 1.0 / 3.0, c = 1.0 / std::sqrt(9.0 * d);
  for (;;) {
    double x, v;
    do {
      x = standard_normal(rng);
      v = 1.0 + c * x;
    } while (v <= 0.0);
    v = v * v * v;
    const double u = uniform_open(rng);
    if (u < 1.0 - 0.0331 * x * x * x * x) return d * v;
    if (std::log(u) < 0.5 * x * x + d * (1.0 - v + std::log(v))) return d * v;
  }
}

}  // namespace

Result<std::vector<double>> arrival_times(int64_t num_requests, const ArrivalOptions& options) {
  if (num_requests < 0) return invalid_argument("--num-prompts must be at least 0");
  if (!(options.request_rate > 0)) {
    return invalid_argument("--request-rate must be positive or inf, got " +
                            std::to_string(options.request_rate));
  }
  if (!(options.burstiness > 0) || std::isinf(options.burstiness)) {
    return invalid_argument("--burstiness must be a positive number, got " +
                            std::to_string(options.burstiness));
  }
  std::vector<double> times(size_t(num_requests), 0.0);
  if (std::isinf(options.request_rate)) return times;
  std::mt19937_64 rng(options.seed);
  const double scale = 1.0 / (options.request_rate * options.burstiness);
  double t = 0;
  for (auto& time : times) {
    t += standard_gamma(rng, options.burstiness) * scale;
    time = t;
  }
  return times;
}

}  // namespace baton::loadtest
