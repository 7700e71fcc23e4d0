// tools/stop_signal.h — SIGINT/SIGTERM as a flag the serving loops poll.
#pragma once

#include <atomic>

namespace baton::tools {

// Installs handlers for SIGINT and SIGTERM (and ignores SIGPIPE: a client
// that hangs up must not kill a server); returns the flag they set.
const std::atomic<bool>& install_stop_signals();
// The signal that set the flag (0 if none yet).
int stop_signal_number();

}  // namespace baton::tools
