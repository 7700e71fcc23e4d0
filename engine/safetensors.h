// engine/safetensors.h — one .safetensors file, memory-mapped read-only.
//
// Format: 8-byte little-endian header length N, N bytes of JSON
// ({"name": {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}}),
// then the data section the offsets index into. `open` validates every entry
// against the file (dtype, shape, offsets inside the data section, size =
// numel x dtype size, no overlaps, aligned) before any pointer into the
// mapping is handed out, so a corrupt or truncated file is an error, never a
// read out of bounds.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/dtype.h"
#include "common/status.h"
#include "common/unique_fd.h"
#include "engine/file_mapping.h"

namespace baton::engine {

struct TensorInfo {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  const void* data = nullptr;  // into the mapping; valid while the file is open
  size_t nbytes = 0;

  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
};

// "[a, b, c]", for error messages.
std::string shape_to_string(const std::vector<int64_t>& shape);

class SafetensorsFile {
 public:
  // Larger headers are refused as corrupt rather than parsed.
  static constexpr uint64_t kMaxHeaderBytes = uint64_t(100) << 20;

  // NotFound / IoError when the file cannot be opened or mapped, DataLoss
  // when it is malformed, Unimplemented for dtypes other than F32/F16/BF16.
  // Every message names the file (and the tensor, where one is at fault).
  static Result<std::unique_ptr<SafetensorsFile>> open(const std::filesystem::path& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::filesystem::path& path() const { return path_; }
  // nullptr when the file has no tensor of that name.
  const TensorInfo* find(std::string_view name) const;
  // Sorted.
  std::vector<std::string> names() const;
  size_t num_tensors() const { return tensors_.size(); }
  const std::map<std::string, std::string, std::less<>>& metadata() const { return metadata_; }
  uint64_t file_size() const { return size_; }
  // The whole file, mapped; tensors' data points into it.
  const void* mapping() const { return map_; }
  // Reads the whole file in now, in 2 MiB pages where the kernel allows it
  // (engine/file_mapping.h). The bytes and their addresses do not change.
  HugePageReport map_in_huge_pages();

 private:
  SafetensorsFile() = default;
  Status parse();

  std::filesystem::path path_;
  UniqueFd fd_;
  void* map_ = nullptr;
  uint64_t size_ = 0;
  std::map<std::string, TensorInfo, std::less<>> tensors_;
  std::map<std::string, std::string, std::less<>> metadata_;
};

}  // namespace baton::engine
