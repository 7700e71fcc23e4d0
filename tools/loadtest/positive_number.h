// tools/loadtest/positive_number.h — the one way `baton bench` reads a
// positive number from a command-line value (rates, SLO milliseconds).
#pragma once

#include <cmath>
#include <exception>
#include <optional>
#include <string>

namespace baton::loadtest {

// The whole of `text` as a number > 0 ("inf" only if `allow_inf`), else nullopt.
inline std::optional<double> parse_positive_number(const std::string& text, bool allow_inf) {
  double value = 0;
  size_t used = 0;
  try {
    value = std::stod(text, &used);
  } catch (const std::exception&) {
    return std::nullopt;
  }
  if (used != text.size() || !(value > 0) || (!allow_inf && std::isinf(value))) return std::nullopt;
  return value;
}

}  // namespace baton::loadtest
