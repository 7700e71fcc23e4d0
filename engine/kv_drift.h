// engine/kv_drift.h — how far a KV cache format moves a model's log-probs.
//
// An 8-bit KV cache (engine.kv_dtype int8 or fp8_e4m3) changes what every
// later position attends to. measure_kv_drift runs one token sequence
// through engines of the same checkpoint that differ only in their KV
// format, a first block of tokens as one prefill step and then one token
// per step (as decode reads its KV), and compares, at every position, the
// log-prob each gives the token the reference engine ranks first.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "common/status.h"
#include "engine/engine.h"

namespace baton::engine {

// A change in a log-prob counted as far: the tail that max_abs, the most
// of a few thousand positions, samples noisily.
inline constexpr double kFarDlogprob = 0.5;

struct KvDrift {
  int64_t positions = 0;
  double sum_abs = 0;   // of |Δ log p| of the reference's greedy token, over positions
  double max_abs = 0;   // of |Δ log p| at any position
  int64_t changed = 0;  // positions whose greedy token differs
  int64_t far = 0;      // positions where |Δ log p| > kFarDlogprob
  double mean_abs() const { return positions > 0 ? sum_abs / double(positions) : 0.0; }
  double change_rate() const { return positions > 0 ? double(changed) / double(positions) : 0.0; }
  double far_rate() const { return positions > 0 ? double(far) / double(positions) : 0.0; }
  // Adds another run's positions (several checkpoints or sequences).
  void add(const KvDrift& other);
};

// `tokens` through `reference` and each of `candidates` (the same
// checkpoint; every pool holds the whole sequence, and no engine runs
// anything meanwhile): the first `first_step` tokens in one step, then one
// per step; every position from the first step's last on is compared.
// InvalidArgument when the engines' vocabularies or block sizes differ, a
// pool is too small or a log-prob is not finite.
Result<std::vector<KvDrift>> measure_kv_drift(Engine& reference,
                                              std::span<Engine* const> candidates,
                                              std::span<const int32_t> tokens, int32_t first_step);

}  // namespace baton::engine
