// engine/memory_share.h — the KV pool's size where engine.memory_fraction
// sets it: the node's share of the memory it computes in, less what its
// weights and a step's workspace already take there. Nodes sharing one
// device each ask for their part of it (gpu-1p1d: a prefill and a decode
// node), without either having to know the device's size.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>

#include "common/status.h"
#include "engine/host_memory.h"
#include "engine/yaml_settings.h"

namespace baton::engine {

struct MemoryShare {
  double fraction = 0;     // engine.memory_fraction, in (0, 1]
  uint64_t memory = 0;     // the device's (or host's) bytes
  uint64_t weights = 0;    // bytes the weights hold there
  uint64_t workspace = 0;  // bytes the largest step holds there
};

// Bytes left for the KV pool; `where` names the memory ("cuda:0", "cpu").
inline Result<uint64_t> pool_bytes_of_share(const MemoryShare& share, const std::string& where) {
  const auto budget = uint64_t(std::floor(share.fraction * double(share.memory)));
  const uint64_t taken = share.weights + share.workspace;
  if (budget > taken) return budget - taken;
  return invalid_argument("engine.memory_fraction: " + format_fraction(share.fraction) + " of " +
                          where + "'s " + bytes_text(share.memory) + " is " + bytes_text(budget) +
                          ", and the weights hold " + bytes_text(share.weights) +
                          " and a step's workspace " + bytes_text(share.workspace) +
                          " of it: nothing is left for the KV pool");
}

}  // namespace baton::engine
