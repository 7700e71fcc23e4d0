// common/role.h — what a process of a cluster does, as one type from the
// cluster YAML through the control messages to the router's registry.
// Strings appear only where it is spelled out: the YAML, the control codec,
// the CLI's subcommands and the JSON and metrics the router shows.
#pragma once

#include <optional>
#include <string_view>

namespace baton {

enum class Role { kRouter, kPrefill, kDecode };

// "router", "prefill", "decode".
std::string_view role_name(Role role);
// The inverse of role_name; nullopt for any other string.
std::optional<Role> parse_role(std::string_view name);

}  // namespace baton
