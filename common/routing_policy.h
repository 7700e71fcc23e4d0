// common/routing_policy.h — how the router picks a node for a request, as
// one type from the cluster YAML (`router.policy`) to the node registry.
#pragma once

#include <optional>
#include <string_view>

namespace baton {

enum class RoutingPolicy {
  kRoundRobin,
  kLeastLoaded,
  // Least-loaded, except that a prompt goes to the node whose prefix cache
  // most likely holds the longest start of it (the node the router last sent
  // those blocks to), unless that node is busier than the least-loaded one
  // by more than a margin.
  kPrefixAware,
};

// "round-robin", "least-loaded", "prefix-aware".
std::string_view routing_policy_name(RoutingPolicy policy);
// The inverse of routing_policy_name; nullopt for any other string.
std::optional<RoutingPolicy> parse_routing_policy(std::string_view name);

}  // namespace baton
