// tools/process_priority.h — engine.nice: a node (or `baton generate`) that
// should yield the cores to the processes beside it lowers its own
// scheduling priority at start.
#pragma once

#include "common/status.h"

namespace baton::tools {

// Lowers the scheduling priority of this process's threads, those running
// and those it starts later, to `nice` (0-19). 0, or a niceness of `nice` or
// more already, leaves it as it is; an unprivileged process may always lower
// its priority.
Status lower_process_priority(int nice);

}  // namespace baton::tools
