#include "tools/process_priority.h"

#include <sys/resource.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>

namespace baton::tools {

Status lower_process_priority(int nice) {
  if (nice == 0) return Status::ok();
  if (nice < 0 || nice > 19) {
    return invalid_argument("engine.nice: must be in [0, 19], got " + std::to_string(nice));
  }
  // A process started at a lower priority already (under `nice -n 15`)
  // keeps it: raising it back takes privileges an operator did not grant.
  errno = 0;
  const int current = getpriority(PRIO_PROCESS, 0);
  if (errno == 0 && current >= nice) return Status::ok();
  // On Linux the niceness is a thread's: the calling thread's, which threads
  // started later inherit, and that of each thread already running (a BLAS
  // library may start its own when it is loaded).
  if (setpriority(PRIO_PROCESS, 0, nice) != 0) {
    return internal_error("engine.nice: setpriority(" + std::to_string(nice) +
                          "): " + std::strerror(errno));
  }
  std::error_code error;
  for (const auto& task : std::filesystem::directory_iterator("/proc/self/task", error)) {
    const auto tid = id_t(std::strtoul(task.path().filename().c_str(), nullptr, 10));
    // A thread that ended meanwhile (ESRCH) needs nothing.
    if (setpriority(PRIO_PROCESS, tid, nice) != 0 && errno != ESRCH) {
      return internal_error("engine.nice: setpriority(" + std::to_string(nice) + ") of thread " +
                            std::to_string(tid) + ": " + std::strerror(errno));
    }
  }
  return Status::ok();
}

}  // namespace baton::tools
