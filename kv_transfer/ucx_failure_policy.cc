#include "kv_transfer/ucx_failure_policy.h"

#include <spdlog/spdlog.h>
#include <ucs/debug/log_def.h>

#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <mutex>

namespace baton::kv_transfer {
namespace {

ucs_log_func_rc_t log_transport_failure_as_error(const char* file, unsigned line,
                                                 const char* function, ucs_log_level_t level,
                                                 const ucs_log_component_config_t* /*component*/,
                                                 const char* format, va_list ap) {
  if (level != UCS_LOG_LEVEL_FATAL || function == nullptr ||
      std::strncmp(function, "uct_", 4) != 0) {
    return UCS_LOG_FUNC_RC_CONTINUE;  // UCX's default handler decides
  }
  char message[1024];  // UCX's own default log buffer
  std::vsnprintf(message, sizeof message, format, ap);
  const char* slash = std::strrchr(file, '/');
  spdlog::error("UCX transport failure ({}:{}, not fatal to this node): {}",
                slash != nullptr ? slash + 1 : file, line, message);
  return UCS_LOG_FUNC_RC_STOP;
}

}  // namespace

void survive_transport_failures() {
  // UCX's handler list is not locked: push before this process's first UCP
  // context exists, and only once.
  static std::once_flag once;
  std::call_once(once, [] { ucs_log_push_handler(log_transport_failure_as_error); });
}

}  // namespace baton::kv_transfer
