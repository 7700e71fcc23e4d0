#include "common/logging.h"

#include <spdlog/sinks/stdout_color_sinks.h>

#include <string>

namespace baton {

Status set_log_level(std::string_view level) {
  auto parsed = spdlog::level::from_str(std::string(level));
  if (parsed == spdlog::level::off && level != "off") {
    return invalid_argument("unknown log level '" + std::string(level) +
                            "' (expected trace, debug, info, warn, error or off)");
  }
  spdlog::set_level(parsed);
  return Status::ok();
}

void init_logging(std::string_view component) {
  auto logger = spdlog::stderr_color_mt(std::string(component));
  spdlog::set_default_logger(logger);
  spdlog::set_pattern("[%H:%M:%S.%e] [%^%l%$] [%n] %v");
}

}  // namespace baton
