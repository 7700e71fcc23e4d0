// tests/engine/greedy_options.h — the generation options the engine tests
// compare runs with: greedy, a fixed length, EOS ignored (random-weight models
// would stop at arbitrary points otherwise).
#pragma once

#include <cstdint>

#include "engine/scheduler.h"

namespace baton::engine::testing {

inline GenerationOptions greedy(int32_t max_tokens) {
  GenerationOptions o;
  o.sampling.temperature = 0;
  o.max_tokens = max_tokens;
  o.ignore_eos = true;
  return o;
}

}  // namespace baton::engine::testing
