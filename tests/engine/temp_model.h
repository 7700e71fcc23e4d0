// tests/engine/temp_model.h — random checkpoints in temporary directories.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>

#include "common/dtype.h"
#include "engine/model_config.h"

namespace baton::engine::testing {

// A fresh directory under the system temp dir, removed when this goes away.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

// Writes `preset` with random weights into a new subdirectory of `dir`.
std::filesystem::path make_preset_model(const TempDir& dir, const std::string& preset, DType dtype,
                                        uint64_t seed);

// Writes `config` with random weights into a new subdirectory `name` of `dir`.
std::filesystem::path make_model(const TempDir& dir, const ModelConfig& config,
                                 const std::string& name, DType dtype, uint64_t seed);

}  // namespace baton::engine::testing
