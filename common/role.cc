#include "common/role.h"

namespace baton {

std::string_view role_name(Role role) {
  switch (role) {
    case Role::kRouter:
      return "router";
    case Role::kPrefill:
      return "prefill";
    case Role::kDecode:
      return "decode";
  }
  return "?";
}

std::optional<Role> parse_role(std::string_view name) {
  for (Role r : {Role::kRouter, Role::kPrefill, Role::kDecode}) {
    if (role_name(r) == name) return r;
  }
  return std::nullopt;
}

}  // namespace baton
