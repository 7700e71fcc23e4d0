#include "tools/open_file_limit.h"

#include <sys/resource.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>

namespace baton::tools {

Status raise_open_file_limit(uint64_t wanted) {
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0) {
    return internal_error(std::string("getrlimit(RLIMIT_NOFILE): ") + std::strerror(errno));
  }
  if (limit.rlim_cur != RLIM_INFINITY && limit.rlim_cur < wanted) {
    const rlim_t raised =
        limit.rlim_max == RLIM_INFINITY ? rlim_t(wanted) : std::min(rlim_t(wanted), limit.rlim_max);
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
                                " (the hard limit, ulimit -Hn), fewer than the " +
                                std::to_string(wanted) + " wanted");
    }
  }
  return Status::ok();
}

}  // namespace baton::tools
