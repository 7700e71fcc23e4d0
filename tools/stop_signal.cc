// tools/stop_signal.cc — async-signal-safe: the handler only stores atomics.
#include "tools/stop_signal.h"

#include <csignal>

namespace baton::tools {
namespace {

std::atomic<bool> g_stop{false};
std::atomic<int> g_signal{0};
static_assert(std::atomic<bool>::is_always_lock_free && std::atomic<int>::is_always_lock_free);

void on_signal(int number) {
  g_signal.store(number);
  g_stop.store(true);
}

}  // namespace

const std::atomic<bool>& install_stop_signals() {
  struct sigaction action {};
  action.sa_handler = on_signal;
  sigemptyset(&action.sa_mask);
  sigaction(SIGINT, &action, nullptr);
  sigaction(SIGTERM, &action, nullptr);
  std::signal(SIGPIPE, SIG_IGN);
  return g_stop;
}

int stop_signal_number() { return g_signal.load(); }

}  // namespace baton::tools
