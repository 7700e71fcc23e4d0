// engine/file_mapping.h — a read-only file mapping that a decode step can
// stream from at full memory bandwidth.
//
// A batch-1 decode step reads every weight once: hundreds of MiB in 4 KiB
// pages is a TLB miss every 64 cache lines, and under a hypervisor each miss
// walks two sets of page tables. Mapped in 2 MiB pages (and so also laid out
// in 2 MiB of contiguous memory) the same weights decoded −3% to +10% faster here,
// about 5% in the median of batch-1 steps (docs/PERFORMANCE.md;
// bench/results/2026-11-29-huge-pages-interleaved-ceiling.md). Linux maps
// a file in 2 MiB pages when the mapping is 2 MiB-aligned and the page cache
// holds the file in 2 MiB folios; it reads a file in such folios into a
// mapping advised MADV_HUGEPAGE, but a file just written (a download,
// `baton make-model`) or read in small pieces sits in the cache in small
// folios and must be read again to get them.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>

#include "common/status.h"
#include "common/unique_fd.h"

namespace baton::engine {

inline constexpr size_t kHugePageBytes = size_t(2) << 20;

// mmap(PROT_READ, MAP_PRIVATE) of the whole file, starting on a 2 MiB
// boundary and advised MADV_HUGEPAGE when the file is at least that long.
// Release with munmap(p, size).
Result<void*> map_file_read_only(int fd, size_t size, const std::string& name);

// What map_in_huge_pages() found and did.
struct HugePageReport {
  uint64_t eligible_bytes = 0;  // the mapping's whole 2 MiB pages
  uint64_t huge_bytes = 0;      // of those, mapped by 2 MiB pages
  bool reread = false;          // the cache held small folios: the file was read again
  std::string note;             // why not, when huge_bytes < eligible_bytes
};

// For a 2 MiB-aligned mapping of at least 2 MiB (others are left as they
// are): faults the whole mapping in, in 2 MiB pages where the kernel allows
// it, then loads one byte per 4 KiB page. If the page cache held the file in
// small folios, its first 2 MiB are dropped (posix_fadvise; pages other
// processes map stay) and read again, and only if they come back in a 2 MiB
// page is the whole file. Only advice to the kernel: where it keeps 4 KiB
// pages, `note` says why; the bytes mapped and their address never change.
HugePageReport map_in_huge_pages(void* mapping, size_t size, int fd);

// An exclusive flock(2) on a checkpoint directory, held while a process
// opens the checkpoint and maps it in 2 MiB pages. Nodes started together on
// one host load the same checkpoint at once; each then maps the other's
// small folios (the header it reads first is in the first 2 MiB), so neither
// can drop them to read them again in 2 MiB folios, and both keep 4 KiB
// pages. Taking turns, the second finds the first's 2 MiB folios. Waits at
// most `patience` for the holder (a process stopped while loading must not
// stall every later start; a dead one releases it at once), logging once it
// has waited a second, then goes ahead without the lock; where flock is
// refused (NFS takes flock as a write lock, which a directory cannot have),
// nothing is held. Directories that share files (a Hugging Face cache's
// snapshots link to shared blobs) do not take turns with each other.
class LoadLock {
 public:
  LoadLock(const std::filesystem::path& dir, std::chrono::milliseconds patience);
  LoadLock(const LoadLock&) = delete;
  LoadLock& operator=(const LoadLock&) = delete;
  bool held() const { return held_; }
  // Another process held it for all of `patience`.
  bool gave_up_waiting() const { return gave_up_; }
  // Why the lock is not held (empty when it is).
  const std::string& note() const { return note_; }

 private:
  UniqueFd fd_;  // its close releases the flock (the last descriptor of it)
  bool held_ = false;
  bool gave_up_ = false;
  std::string note_;
};

// The "<field>:" value, in bytes, of the /proc/<pid>/smaps entry whose range
// starts at `start` (e.g. "FilePmdMapped"); nullopt when there is none.
std::optional<uint64_t> smaps_field_bytes(std::string_view smaps, uintptr_t start,
                                          std::string_view field);

}  // namespace baton::engine
