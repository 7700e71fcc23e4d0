#include "tools/open_file_limit.h"

#include <sys/resource.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <string>

namespace baton::tools {

Status raise_open_file_limit(uint64_t wanted) {
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0) {
    return internal_error(std::string("getrlimit(RLIMIT_NOFILE): ") + std::strerror(errno));
  }
  if (limit.rlim_cur != RLIM_INFINITY && limit.rlim_cur < wanted) {
    // No process may go past fs.nr_open, whatever its hard limit says.
    rlim_t ceiling = limit.rlim_max;
    if (std::ifstream nr_open("/proc/sys/fs/nr_open"); nr_open) {
      uint64_t system = 0;
      if (nr_open >> system && system > 0) ceiling = std::min(ceiling, rlim_t(system));
    }
    const rlim_t raised = std::max(limit.rlim_cur, std::min(rlim_t(wanted), ceiling));
    if (raised > limit.rlim_cur) {
      rlimit set = limit;
      set.rlim_cur = raised;
      if (setrlimit(RLIMIT_NOFILE, &set) != 0) {
        return internal_error("setrlimit(RLIMIT_NOFILE, " + std::to_string(raised) +
                              "): " + std::strerror(errno));
      }
    }
    if (raised < wanted) {
      return resource_exhausted("open files are limited to " + std::to_string(raised) +
                                " (the hard limit, ulimit -Hn, or fs.nr_open), fewer than the " +
                                std::to_string(wanted) + " wanted");
    }
  }
  return Status::ok();
}

}  // namespace baton::tools
