// engine/host_memory.h — how much memory this process may use: the
// machine's, or less where its cgroup (a container) sets a limit. What a
// CPU node's KV pool, and a device pool's host staging slots, are held against at
// start, so that one that can never fit is refused with the numbers instead
// of killing the node, or filling the machine, once its blocks are touched.
#pragma once

#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <string>

#include "common/status.h"

namespace baton::engine {

// 0 where neither is known.
inline uint64_t host_memory_bytes() {
  const long pages = ::sysconf(_SC_PHYS_PAGES);
  const long page = ::sysconf(_SC_PAGESIZE);
  uint64_t memory = pages > 0 && page > 0 ? uint64_t(pages) * uint64_t(page) : 0;
  // cgroup v2: a number of bytes, or "max".
  std::ifstream limit_file("/sys/fs/cgroup/memory.max");
  std::string limit;
  if (limit_file >> limit && !limit.empty() &&
      limit.find_first_not_of("0123456789") == std::string::npos && limit.size() < 20) {
    const uint64_t cgroup = std::stoull(limit);
    memory = memory == 0 ? cgroup : std::min(memory, cgroup);
  }
  return memory;
}

// "1.5 GiB", for messages.
inline std::string gib_text(uint64_t bytes) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f GiB", double(bytes) / double(1ull << 30));
  return text;
}

// "1.5 GiB", "12.0 MiB", "300.0 KiB": the largest unit the bytes reach.
inline std::string bytes_text(uint64_t bytes) {
  if (bytes >= (1ull << 30)) return gib_text(bytes);
  char text[32];
  const bool mib = bytes >= (1ull << 20);
  std::snprintf(text, sizeof text, "%.1f %s", double(bytes) / double(mib ? 1ull << 20 : 1ull << 10),
                mib ? "MiB" : "KiB");
  return text;
}

// Refuses `bytes` of host memory this process could never hold (nothing
// where the machine's memory is unknown); `what` names them and the setting
// that sized them, and starts the message.
inline Status check_fits_host_memory(uint64_t bytes, const std::string& what) {
  const uint64_t memory = host_memory_bytes();
  if (memory == 0 || bytes <= memory) return Status::ok();
  return invalid_argument(what + " is more than the " + gib_text(memory) +
                          " of memory this machine (or its cgroup) has");
}

}  // namespace baton::engine
