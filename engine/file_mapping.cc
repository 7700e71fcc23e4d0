#include "engine/file_mapping.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

// Linux 5.14; older headers lack the name, older kernels refuse it (EINVAL).
#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22
#endif

namespace baton::engine {
namespace {

uintptr_t round_up(uintptr_t v, uintptr_t to) { return (v + to - 1) / to * to; }

std::string errno_text(const char* call) { return std::string(call) + ": " + std::strerror(errno); }

// One load per 4 KiB page. A hypervisor that backs guest memory lazily
// charges the first CPU access to memory a disk read just filled, per 4 KiB
// page (1.4 s for a 1.9 GB checkpoint here, then full speed): paid here, not
// by the first request. Elsewhere it costs milliseconds.
void touch_every_page(const void* mapping, size_t size) {
  constexpr size_t kPage = 4096;
  const volatile auto* bytes = static_cast<const volatile uint8_t*>(mapping);
  uint8_t sink = 0;
  for (size_t offset = 0; offset < size; offset += kPage) sink ^= bytes[offset];
  (void)sink;
}

// Faults the whole mapping in: MADV_POPULATE_READ takes a load's fault path,
// 2 MiB at a time where the cache has 2 MiB folios; a kernel without it
// (before 5.14) gets the loads.
void fault_in(void* mapping, size_t size) {
  if (madvise(mapping, size, MADV_POPULATE_READ) != 0) touch_every_page(mapping, size);
}

std::optional<uint64_t> huge_bytes_now(void* mapping) {
  std::ifstream in("/proc/self/smaps");
  if (!in) return std::nullopt;
  std::stringstream text;
  text << in.rdbuf();
  return smaps_field_bytes(text.str(), uintptr_t(mapping), "FilePmdMapped");
}

}  // namespace

Result<void*> map_file_read_only(int fd, size_t size, const std::string& name) {
  if (size < kHugePageBytes) {
    void* map = mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (map == MAP_FAILED) return io_error("cannot mmap " + name + ": " + std::strerror(errno));
    return map;
  }
  // Reserve address space a huge page longer than the file, map the file at
  // its first 2 MiB boundary, and give back the rest of the reservation.
  const size_t reserved = size + kHugePageBytes;
  void* area =
      mmap(nullptr, reserved, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (area == MAP_FAILED) {
    return io_error("cannot reserve address space for " + name + ": " + std::strerror(errno));
  }
  const auto begin = uintptr_t(area);
  const uintptr_t aligned = round_up(begin, kHugePageBytes);
  void* map =
      mmap(reinterpret_cast<void*>(aligned), size, PROT_READ, MAP_PRIVATE | MAP_FIXED, fd, 0);
  if (map == MAP_FAILED) {
    const int err = errno;
    munmap(area, reserved);
    return io_error("cannot mmap " + name + ": " + std::strerror(err));
  }
  const uintptr_t map_end = round_up(aligned + size, uintptr_t(sysconf(_SC_PAGESIZE)));
  if (aligned > begin) munmap(area, aligned - begin);
  if (begin + reserved > map_end)
    munmap(reinterpret_cast<void*>(map_end), begin + reserved - map_end);
  // Advised before anything reads it (the header, the norms): a page cache
  // miss then reads 2 MiB folios. Only advice; refused, 4 KiB pages serve.
  (void)madvise(map, size, MADV_HUGEPAGE);
  return map;
}

namespace {

// Maps the file again over `mapping`: the old page tables go with the old
// mapping (MADV_DONTNEED keeps them before Linux 6.14, and a range that has
// one is never mapped by a 2 MiB page), the address stays.
bool remap(void* mapping, size_t size, int fd) {
  void* again = mmap(mapping, size, PROT_READ, MAP_PRIVATE | MAP_FIXED, fd, 0);
  return again == mapping && madvise(mapping, size, MADV_HUGEPAGE) == 0;
}

// Drops our pages and the page cache's of [offset, offset + length) (dirty
// pages are written back first: fadvise drops only clean ones; pages another
// process maps stay), then reads that range in again through the mapping.
bool reread(void* mapping, size_t size, int fd, size_t offset, size_t length) {
  if (!remap(mapping, size, fd)) return false;
  (void)fdatasync(fd);
  if (int err = posix_fadvise(fd, off_t(offset), off_t(length), POSIX_FADV_DONTNEED); err != 0) {
    errno = err;
    return false;
  }
  fault_in(static_cast<char*>(mapping) + offset, length);
  return true;
}

}  // namespace

HugePageReport map_in_huge_pages(void* mapping, size_t size, int fd) {
  HugePageReport report;
  report.eligible_bytes = size / kHugePageBytes * kHugePageBytes;
  if (report.eligible_bytes == 0) return report;
  if (uintptr_t(mapping) % kHugePageBytes != 0) {
    report.note = "mapping is not 2 MiB-aligned";
    return report;
  }
  const bool advised = madvise(mapping, size, MADV_HUGEPAGE) == 0;
  if (!advised) report.note = errno_text("madvise(MADV_HUGEPAGE)");
  fault_in(mapping, size);
  std::optional<uint64_t> huge = huge_bytes_now(mapping);
  if (!huge) {
    report.note = "no FilePmdMapped in /proc/self/smaps";
  } else if (advised && *huge < report.eligible_bytes) {
    // Small folios in the page cache. Re-read the first 2 MiB alone, and the
    // whole file only if that came back in a 2 MiB page: where re-reading
    // cannot help (no large folios in this file system, THP off, pages
    // another process maps), every start would read the checkpoint again.
    if (!reread(mapping, size, fd, 0, kHugePageBytes)) {
      report.note = errno_text("re-reading the first 2 MiB");
    } else if (huge_bytes_now(mapping).value_or(0) < kHugePageBytes) {
      report.note = "re-read, the first 2 MiB still came back in 4 KiB pages";
    } else if (!reread(mapping, size, fd, 0, size)) {
      report.note = errno_text("re-reading the file");
    } else {
      report.reread = true;
    }
    fault_in(mapping, size);  // what a failed step left unmapped
    huge = huge_bytes_now(mapping);
  }
  touch_every_page(mapping, size);
  report.huge_bytes = huge.value_or(0);
  if (report.huge_bytes < report.eligible_bytes && report.note.empty()) {
    report.note =
        "the kernel kept 4 KiB pages (file system without large folios, pages mapped by another "
        "process, or transparent huge pages disabled)";
  }
  return report;
}

LoadLock::LoadLock(const std::filesystem::path& dir, std::chrono::milliseconds patience) {
  fd_.reset(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!fd_.valid()) {
    note_ = errno_text("open");
    return;
  }
  const auto start = std::chrono::steady_clock::now();
  bool said_waiting = false;
  while (true) {
    if (flock(fd_.get(), LOCK_EX | LOCK_NB) == 0) {
      held_ = true;
      return;
    }
    if (errno != EWOULDBLOCK) {
      note_ = errno_text("flock");
      return;
    }
    const auto waited = std::chrono::steady_clock::now() - start;
    if (waited >= patience) {
      gave_up_ = true;
      note_ = "another process held it for longer than " + std::to_string(patience.count()) + " ms";
      return;
    }
    if (!said_waiting && waited >= std::chrono::seconds(1)) {
      spdlog::info("waiting for another process loading {} (it holds the load lock)", dir.string());
      said_waiting = true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

std::optional<uint64_t> smaps_field_bytes(std::string_view smaps, uintptr_t start,
                                          std::string_view field) {
  // An entry opens with "<start>-<end> perms offset dev inode path" (hex
  // addresses, no 0x) and continues with "Name:   value kB" lines.
  bool in_entry = false;
  while (!smaps.empty()) {
    const size_t eol = smaps.find('\n');
    std::string_view line = smaps.substr(0, eol);
    smaps.remove_prefix(eol == std::string_view::npos ? smaps.size() : eol + 1);
    const size_t colon = line.find(':');
    const size_t dash = line.find('-');
    const bool header =
        dash != std::string_view::npos && (colon == std::string_view::npos || dash < colon);
    if (header) {
      uintptr_t entry_start = 0;
      auto [end, ec] = std::from_chars(line.data(), line.data() + dash, entry_start, 16);
      in_entry = ec == std::errc() && end == line.data() + dash && entry_start == start;
      continue;
    }
    if (!in_entry || colon == std::string_view::npos || line.substr(0, colon) != field) continue;
    std::string_view value = line.substr(colon + 1);
    while (!value.empty() && value.front() == ' ') value.remove_prefix(1);
    uint64_t kib = 0;
    auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), kib);
    if (ec != std::errc() || std::string_view(end, value.data() + value.size()) != " kB") {
      return std::nullopt;
    }
    return kib << 10;
  }
  return std::nullopt;
}

}  // namespace baton::engine
