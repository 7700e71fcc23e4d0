#include "engine/file_mapping.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <sstream>
#include <thread>
#include <vector>

#include "engine/safetensors.h"
#include "engine/safetensors_writer.h"
#include "tests/engine/loader_test_util.h"

namespace baton::engine {
namespace {

using loader_testing::ScratchDir;
using loader_testing::write_file;

std::string random_bytes(size_t n) {
  std::mt19937_64 rng(std::random_device{}());
  std::string s(n, '\0');
  for (char& c : s) c = char(rng() & 0xff);
  return s;
}

// An open file descriptor, closed at scope exit.
struct Fd {
  explicit Fd(const std::filesystem::path& path) : fd(::open(path.c_str(), O_RDONLY)) {}
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
  int fd;
};

// Writes `bytes` a page at a time, so the page cache holds them in small
// folios (one big write can leave large ones).
void write_in_pages(const std::filesystem::path& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  for (size_t offset = 0; offset < bytes.size(); offset += 4096) {
    out.write(bytes.data() + offset,
              std::streamsize(std::min<size_t>(4096, bytes.size() - offset)));
    out.flush();
  }
  ASSERT_TRUE(out.good());
}

TEST(SmapsFieldTest, FindsTheFieldOfTheEntryStartingThere) {
  const std::string smaps =
      "7f0000000000-7f0000400000 r--p 00000000 fe:00 12   /models/a.safetensors\n"
      "Size:               4096 kB\n"
      "FilePmdMapped:      2048 kB\n"
      "VmFlags: rd mr mw me hg\n"
      "7f0000400000-7f0000c00000 r--p 00000000 fe:00 13   /models/b-00001-of-00002.safetensors\n"
      "Size:               8192 kB\n"
      "FilePmdMapped:      6144 kB\n"
      "7f0000c00000-7f0000c01000 rw-p 00000000 00:00 0\n"
      "Size:                  4 kB\n";
  EXPECT_EQ(smaps_field_bytes(smaps, 0x7f0000000000, "FilePmdMapped"), 2048u << 10);
  EXPECT_EQ(smaps_field_bytes(smaps, 0x7f0000400000, "FilePmdMapped"), 6144u << 10);
  EXPECT_EQ(smaps_field_bytes(smaps, 0x7f0000400000, "Size"), 8192u << 10);
  // An entry without the field does not borrow the next or previous one's.
  EXPECT_FALSE(smaps_field_bytes(smaps, 0x7f0000c00000, "FilePmdMapped").has_value());
  // An address inside an entry is not its start.
  EXPECT_FALSE(smaps_field_bytes(smaps, 0x7f0000001000, "Size").has_value());
  EXPECT_FALSE(smaps_field_bytes("", 0x7f0000000000, "Size").has_value());
  EXPECT_FALSE(
      smaps_field_bytes("1000-2000 r--p 0 0:0 0\nSize: many kB\n", 0x1000, "Size").has_value());
}

TEST(FileMappingTest, MapsWholeFilesFromA2MiBBoundaryWithTheirBytes) {
  ScratchDir dir;
  // Under one huge page, exactly two, and a ragged tail past two.
  for (size_t size : {size_t(12345), 2 * kHugePageBytes, 2 * kHugePageBytes + 4097}) {
    const auto path = dir / ("f" + std::to_string(size));
    const std::string bytes = random_bytes(size);
    write_file(path, bytes);
    Fd file(path);
    ASSERT_GE(file.fd, 0);
    auto map = map_file_read_only(file.fd, size, path.string());
    ASSERT_TRUE(map.is_ok()) << map.status().to_string();
    if (size >= kHugePageBytes) EXPECT_EQ(uintptr_t(*map) % kHugePageBytes, 0u) << size;
    EXPECT_EQ(std::memcmp(*map, bytes.data(), size), 0) << size;
    ASSERT_EQ(munmap(*map, size), 0);
  }
}

TEST(FileMappingTest, HugePagesKeepEveryByteAndReportWhatTheyGot) {
  ScratchDir dir;
  const size_t size = 3 * kHugePageBytes + 1000;
  const auto path = dir / "w";
  const std::string bytes = random_bytes(size);
  write_in_pages(path, bytes);
  Fd file(path);
  ASSERT_GE(file.fd, 0);
  auto map = map_file_read_only(file.fd, size, path.string());
  ASSERT_TRUE(map.is_ok()) << map.status().to_string();
  const HugePageReport report = map_in_huge_pages(*map, size, file.fd);
  EXPECT_EQ(report.eligible_bytes, 3 * kHugePageBytes);
  EXPECT_LE(report.huge_bytes, report.eligible_bytes);
  EXPECT_EQ(report.huge_bytes % kHugePageBytes, 0u);
  // Only a file that was all in huge pages at once is not read again, unless
  // the kernel refused (the note says why); a shortfall always says why.
  EXPECT_TRUE(report.reread || report.huge_bytes == report.eligible_bytes || !report.note.empty());
  if (report.huge_bytes < report.eligible_bytes) EXPECT_FALSE(report.note.empty());
  // Dropped and read again (or not): the same bytes at the same address.
  EXPECT_EQ(std::memcmp(*map, bytes.data(), size), 0);
  // Asked again, nothing is left to re-read where the first call succeeded.
  const HugePageReport again = map_in_huge_pages(*map, size, file.fd);
  EXPECT_GE(again.huge_bytes, report.huge_bytes);
  if (report.huge_bytes == report.eligible_bytes) EXPECT_FALSE(again.reread);
  EXPECT_EQ(std::memcmp(*map, bytes.data(), size), 0);
  ASSERT_EQ(munmap(*map, size), 0);
}

// The machine's own answer, found without Baton's loader: whether the
// kernel maps a file that is not in the page cache in 2 MiB pages when it
// is read through an advised, 2 MiB-aligned mapping (THP for file
// mappings, large folios in this file system). Written, synced and dropped
// from the cache, then read with the kernel's primitives alone.
bool kernel_maps_uncached_file_in_huge_pages(const std::filesystem::path& dir) {
  const size_t size = 4 * kHugePageBytes;
  const auto path = dir / "probe";
  const std::string bytes = random_bytes(size);
  {
    std::ofstream out(path, std::ios::binary);
    out.write(bytes.data(), std::streamsize(size));
  }
  Fd fd(path);
  if (fd.fd < 0 || fdatasync(fd.fd) != 0) return false;
  if (posix_fadvise(fd.fd, 0, off_t(size), POSIX_FADV_DONTNEED) != 0) return false;
  // Reserve twice the size to find a 2 MiB boundary, then map the file there.
  void* area = mmap(nullptr, 2 * size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (area == MAP_FAILED) return false;
  const uintptr_t aligned =
      (uintptr_t(area) + kHugePageBytes - 1) / kHugePageBytes * kHugePageBytes;
  void* map =
      mmap(reinterpret_cast<void*>(aligned), size, PROT_READ, MAP_PRIVATE | MAP_FIXED, fd.fd, 0);
  bool huge = false;
  if (map != MAP_FAILED && madvise(map, size, MADV_HUGEPAGE) == 0) {
    volatile uint8_t sum = 0;
    for (size_t offset = 0; offset < size; offset += 4096)
      sum = sum + static_cast<const uint8_t*>(map)[offset];
    std::ifstream smaps("/proc/self/smaps");
    std::stringstream text;
    text << smaps.rdbuf();
    huge = smaps_field_bytes(text.str(), aligned, "FilePmdMapped").value_or(0) >= kHugePageBytes;
  }
  munmap(area, 2 * size);
  return huge;
}

// One holder at a time; a second gives up after its patience, saying so,
// and takes the lock once the first is gone. A directory that is not there
// is no lock and no wait.
TEST(LoadLockTest, OneHolderAtATimeAndAWaitThatEnds) {
  ScratchDir dir;
  {
    LoadLock first(dir.path(), std::chrono::milliseconds(100));
    ASSERT_TRUE(first.held()) << first.note();
    const auto start = std::chrono::steady_clock::now();
    LoadLock second(dir.path(), std::chrono::milliseconds(100));
    EXPECT_FALSE(second.held());
    EXPECT_TRUE(second.gave_up_waiting());
    EXPECT_FALSE(second.note().empty());
    EXPECT_GE(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(100));
  }
  LoadLock third(dir.path(), std::chrono::milliseconds(100));
  EXPECT_TRUE(third.held()) << third.note();
  LoadLock missing(dir / "not-there", std::chrono::seconds(10));
  EXPECT_FALSE(missing.held());
  EXPECT_FALSE(missing.gave_up_waiting());
  EXPECT_FALSE(missing.note().empty());
}

// A checkpoint file as a node holds it once loaded: mapped, with what the
// load found. Unmapped on destruction.
struct Loaded {
  void* map = nullptr;
  size_t size = 0;
  uint64_t huge_bytes = 0;
  bool bytes_ok = false;
  ~Loaded() {
    if (map != nullptr) munmap(map, size);
  }
};

// What a node's start does to its checkpoint: under the load lock, it maps
// the file, reads the header at its start (then `after_header`) and maps it
// in 2 MiB pages; like a running node, it keeps the mapping after the lock
// is gone.
std::unique_ptr<Loaded> load_like_a_node(const std::filesystem::path& dir,
                                         const std::filesystem::path& file,
                                         const std::string& bytes,
                                         const std::function<void()>& after_header = {}) {
  auto loaded = std::make_unique<Loaded>();
  Fd fd(file);
  if (fd.fd < 0) return loaded;
  bool header_ok = false;
  {
    LoadLock lock(dir, std::chrono::seconds(60));
    auto map = map_file_read_only(fd.fd, bytes.size(), file.string());
    if (!map.is_ok()) return loaded;
    loaded->map = *map;
    loaded->size = bytes.size();
    header_ok = std::memcmp(loaded->map, bytes.data(), 4096) == 0;
    if (after_header) after_header();
    loaded->huge_bytes = map_in_huge_pages(loaded->map, bytes.size(), fd.fd).huge_bytes;
  }
  loaded->bytes_ok = header_ok && std::memcmp(loaded->map, bytes.data(), bytes.size()) == 0;
  return loaded;
}

// A child process, killed and reaped if the test ends before it does, and
// the pipes between it and the test.
struct ChildProcess {
  pid_t pid = -1;
  std::vector<int> fds;
  ~ChildProcess() {
    for (int fd : fds) close(fd);
    if (pid > 0) {
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
    }
  }
  // Waits for it to exit; true if it exited with status 0.
  bool exited_cleanly() {
    int status = 0;
    const bool reaped = waitpid(pid, &status, 0) == pid;
    pid = -1;
    return reaped && WIFEXITED(status) && WEXITSTATUS(status) == 0;
  }
};

// Two nodes starting together on one host, loading the same checkpoint
// just written: without turns each maps the other's small folios and both
// keep 4 KiB pages; with the load lock both get 2 MiB pages. (Where this
// machine cannot map even one process's fresh file in 2 MiB pages, there is
// nothing to compare.)
TEST(FileMappingTest, ProcessesLoadingTogetherTakeTurnsAndBothGetHugePages) {
  ScratchDir scratch;
  const size_t size = 24 * kHugePageBytes;
  const auto alone_dir = scratch / "alone", together_dir = scratch / "together";
  std::filesystem::create_directories(alone_dir);
  std::filesystem::create_directories(together_dir);
  const std::string bytes = random_bytes(size);
  write_in_pages(alone_dir / "w", bytes);
  {
    auto alone = load_like_a_node(alone_dir, alone_dir / "w", bytes);
    ASSERT_TRUE(alone->bytes_ok) << "bytes differ";
    if (alone->huge_bytes < size) {
      // A skip only where the kernel itself cannot; where it can, the
      // loader getting 4 KiB pages is the loader's failure.
      if (!kernel_maps_uncached_file_in_huge_pages(scratch.path())) {
        GTEST_SKIP() << "not checked: this kernel maps a file read through an advised mapping "
                        "in 4 KiB pages (no file THP or no large folios here), so there are no "
                        "2 MiB pages for nodes loading together to share";
      }
      FAIL() << "the kernel maps this file system's files in 2 MiB pages, but a node loading "
                "alone got "
             << alone->huge_bytes << " of " << size << " bytes in them";
    }
  }

  write_in_pages(together_dir / "w", bytes);
  // The other process starts first and reads its header (maps the file's
  // first page), then takes its time: without turns, this one's attempt to
  // read the first 2 MiB again finds that page pinned and gives up. Loaded,
  // it keeps its mapping until this one is done, as a running node would.
  int header_read[2], result[2], done[2];
  ASSERT_EQ(pipe(header_read), 0);
  ASSERT_EQ(pipe(result), 0);
  ASSERT_EQ(pipe(done), 0);
  ChildProcess child;
  child.pid = fork();
  ASSERT_GE(child.pid, 0);
  if (child.pid == 0) {
    for (int fd : {header_read[0], result[0], done[1]}) close(fd);
    auto loaded = load_like_a_node(together_dir, together_dir / "w", bytes, [&] {
      (void)!write(header_read[1], "h", 1);
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
    });
    const uint64_t reply = loaded->bytes_ok ? loaded->huge_bytes : ~uint64_t(0);
    if (write(result[1], &reply, sizeof reply) != sizeof reply) _exit(3);
    char c;
    (void)!read(done[0], &c, 1);  // end of file: the test has loaded
    _exit(0);
  }
  for (int fd : {header_read[1], result[1], done[0]}) close(fd);
  child.fds = {header_read[0], result[0], done[1]};
  char c;
  ASSERT_EQ(read(header_read[0], &c, 1), 1) << "the other process ended before its header";
  auto mine = load_like_a_node(together_dir, together_dir / "w", bytes);
  uint64_t theirs = 0;
  ASSERT_EQ(read(result[0], &theirs, sizeof theirs), ssize_t(sizeof theirs));
  close(done[1]);
  child.fds.pop_back();
  EXPECT_TRUE(child.exited_cleanly());
  EXPECT_TRUE(mine->bytes_ok) << "bytes differ in this process";
  EXPECT_NE(theirs, ~uint64_t(0)) << "bytes differ in the other process";
  EXPECT_EQ(mine->huge_bytes, size);
  EXPECT_EQ(theirs, size);
}

TEST(FileMappingTest, SafetensorsTensorsReadTheSameInHugePages) {
  ScratchDir dir;
  // Written in this order: 4-byte elements first.
  const std::vector<TensorSpec> specs = {{"b", DType::kF32, {8}},
                                         {"w", DType::kBF16, {1536, 1536}}};
  const std::string data = random_bytes(8 * 4 + 1536 * 1536 * 2);
  const auto path = dir / "m.safetensors";
  {
    auto w = SafetensorsWriter::create(path, specs, {});
    ASSERT_TRUE(w.is_ok()) << w.status().to_string();
    ASSERT_TRUE((*w)->write(data.data(), data.size()).is_ok());
    ASSERT_TRUE((*w)->finish().is_ok());
  }
  auto file = SafetensorsFile::open(path);
  ASSERT_TRUE(file.is_ok()) << file.status().to_string();
  const TensorInfo* w = (*file)->find("w");
  const TensorInfo* b = (*file)->find("b");
  ASSERT_NE(w, nullptr);
  ASSERT_NE(b, nullptr);
  const void* w_before = w->data;
  const HugePageReport report = (*file)->map_in_huge_pages();
  EXPECT_GT(report.eligible_bytes, 0u);
  EXPECT_EQ(w->data, w_before);
  EXPECT_EQ(std::memcmp(b->data, data.data(), b->nbytes), 0);
  EXPECT_EQ(std::memcmp(w->data, data.data() + b->nbytes, w->nbytes), 0);
}

}  // namespace
}  // namespace baton::engine
