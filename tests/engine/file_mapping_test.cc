#include "engine/file_mapping.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <random>

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
  // Just written a page at a time: the page cache holds it in small folios
  // (on file systems with large folios, one big write would leave big ones).
  {
    std::ofstream out(path, std::ios::binary);
    for (size_t offset = 0; offset < size; offset += 4096) {
      out.write(bytes.data() + offset, std::streamsize(std::min<size_t>(4096, size - offset)));
      out.flush();
    }
    ASSERT_TRUE(out.good());
  }
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
