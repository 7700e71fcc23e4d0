// engine/device.h — where an engine computes: `cpu`, `cuda` or `cuda:N`, as
// the YAML key engine.device and `baton generate --device` spell it.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "common/status.h"

namespace baton::engine {

struct Device {
  enum class Kind : uint8_t { kCpu, kCuda };
  Kind kind = Kind::kCpu;
  int32_t index = 0;  // the CUDA device's ordinal; 0 for the CPU

  bool is_cuda() const { return kind == Kind::kCuda; }
  std::string name() const;  // "cpu", "cuda:0"
  bool operator==(const Device&) const = default;
};

// Why every node of a cluster computes on one kind of device, for the
// refusals of the cluster's YAML and of the router's registry.
inline constexpr std::string_view kOneDeviceKindReason =
    "KV blocks move between nodes byte for byte, and the CPU backend keeps keys grouped where "
    "the CUDA backend keeps them token-major, so all nodes compute on the same kind of device";

// "cpu", "cuda" (device 0) or "cuda:N"; anything else is InvalidArgument
// naming `key` and what was given.
Result<Device> parse_device(std::string_view text, std::string_view key);

}  // namespace baton::engine
