// engine/safetensors_writer.h — writes a .safetensors file as a stream.
//
// The tensors are declared up front (name, dtype, shape), so the header with
// every data offset is written first; then the caller streams each tensor's
// bytes in declaration order, in chunks of any size. Nothing larger than one
// chunk is ever held in memory, which is what lets make-model write a 16 GB
// llama3-8b.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "common/status.h"
#include "common/unique_fd.h"

namespace baton::engine {

struct TensorSpec {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;

  uint64_t nbytes() const;
};

class SafetensorsWriter {
 public:
  // Creates (truncates) `path` and writes the header. Tensor names must be
  // unique and not "__metadata__"; dims non-negative; and, since tensors are
  // packed back to back, each must start aligned to its element size (e.g.
  // F32 tensors before an odd-sized BF16 one).
  static Result<std::unique_ptr<SafetensorsWriter>> create(
      const std::filesystem::path& path, std::vector<TensorSpec> tensors,
      const std::map<std::string, std::string>& metadata = {});
  ~SafetensorsWriter() = default;  // closes the file; an unfinished file stays as written
  SafetensorsWriter(const SafetensorsWriter&) = delete;
  SafetensorsWriter& operator=(const SafetensorsWriter&) = delete;

  // Appends bytes of the data section: the tensors' data, back to back, in
  // declaration order. Writing past the declared total is an error.
  Status write(const void* data, size_t nbytes);
  // Checks that every declared byte was written, then flushes and closes.
  Status finish();

  // Bytes of the data section still expected.
  uint64_t remaining() const { return total_ - written_; }

 private:
  SafetensorsWriter() = default;
  Status write_all(const void* data, size_t nbytes);

  std::filesystem::path path_;
  UniqueFd fd_;
  uint64_t total_ = 0;
  uint64_t written_ = 0;
};

}  // namespace baton::engine
