// common/logging.h — one place that configures spdlog for every Baton binary.
#pragma once

#include <spdlog/spdlog.h>

#include <string_view>

#include "common/status.h"

namespace baton {

// Sets the global level from a name ("trace", "debug", "info", "warn",
// "error", "off"); an unknown name is an error naming it.
Status set_log_level(std::string_view level);

// "[time] [level] [component] message" on stderr, so stdout stays for results.
void init_logging(std::string_view component);

}  // namespace baton
