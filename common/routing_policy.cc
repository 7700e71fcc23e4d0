#include "common/routing_policy.h"

namespace baton {

std::string_view routing_policy_name(RoutingPolicy policy) {
  switch (policy) {
    case RoutingPolicy::kRoundRobin:
      return "round-robin";
    case RoutingPolicy::kLeastLoaded:
      return "least-loaded";
    case RoutingPolicy::kPrefixAware:
      return "prefix-aware";
  }
  return "?";
}

std::optional<RoutingPolicy> parse_routing_policy(std::string_view name) {
  for (RoutingPolicy p :
       {RoutingPolicy::kRoundRobin, RoutingPolicy::kLeastLoaded, RoutingPolicy::kPrefixAware}) {
    if (routing_policy_name(p) == name) return p;
  }
  return std::nullopt;
}

}  // namespace baton
