// tests/engine/loader_test_util.h — temp directories and raw file helpers for
// the checkpoint-loading tests.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "common/status.h"

namespace baton::engine::loader_testing {

// A fresh directory under the system temp dir, removed with everything in it.
class ScratchDir {
 public:
  ScratchDir() {
    std::random_device rd;
    const auto base = std::filesystem::temp_directory_path();
    for (;;) {
      path_ = base / ("baton-loader-" + std::to_string(rd()) + std::to_string(rd()));
      if (std::filesystem::create_directory(path_)) break;
    }
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  const std::filesystem::path& path() const { return path_; }
  std::filesystem::path operator/(const std::string& name) const { return path_ / name; }

 private:
  std::filesystem::path path_;
};

inline void write_file(const std::filesystem::path& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), std::streamsize(bytes.size()));
  ASSERT_TRUE(out.good()) << path;
}

inline std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// A safetensors file from its parts, byte by byte: 8-byte little-endian
// `header_len` (the header's real length unless given), header padded with
// spaces so the data starts 8-aligned, data.
inline std::string raw_safetensors(std::string header, const std::string& data,
                                   int64_t header_len = -1) {
  header.append((8 - header.size() % 8) % 8, ' ');
  uint64_t n = header_len < 0 ? header.size() : uint64_t(header_len);
  std::string out;
  for (int i = 0; i < 8; ++i) out.push_back(char((n >> (8 * i)) & 0xff));
  return out + header + data;
}

// Same, with the header exactly as given.
inline std::string raw_safetensors_unpadded(const std::string& header, const std::string& data) {
  uint64_t n = header.size();
  std::string out;
  for (int i = 0; i < 8; ++i) out.push_back(char((n >> (8 * i)) & 0xff));
  return out + header + data;
}

// Expects `s` to fail with `code` and a message containing every needle.
inline void expect_error(const Status& s, StatusCode code,
                         const std::vector<std::string>& needles) {
  EXPECT_FALSE(s.is_ok());
  EXPECT_EQ(s.code(), code) << s.to_string();
  for (const std::string& n : needles) {
    EXPECT_NE(s.message().find(n), std::string::npos) << "'" << n << "' not in: " << s.message();
  }
}

}  // namespace baton::engine::loader_testing
