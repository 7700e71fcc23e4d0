// tools/open_file_limit.h — a router holds a descriptor per client
// connection: its soft limit on open files (often 1024) must not cap it
// below router.max_connections, where accept() failing with EMFILE would
// also keep out new ZeroMQ clients and nodes reconnecting.
#pragma once

#include <cstdint>

#include "common/status.h"

namespace baton::tools {

// Raises this process's soft RLIMIT_NOFILE to `wanted`, or to its hard
// limit when that is lower (then ResourceExhausted naming both; the limit
// is raised as far as it goes). Never lowers it.
Status raise_open_file_limit(uint64_t wanted);

}  // namespace baton::tools
