#include "tests/engine/temp_model.h"

#include <gtest/gtest.h>

#include <random>

#include "engine/make_model.h"

namespace baton::engine::testing {

TempDir::TempDir() {
  std::random_device rd;
  path_ = std::filesystem::temp_directory_path() /
          ("baton-test-" + std::to_string(rd()) + "-" + std::to_string(rd()));
  std::filesystem::create_directories(path_);
}

TempDir::~TempDir() {
  std::error_code ignored;
  std::filesystem::remove_all(path_, ignored);
}

std::filesystem::path make_model(const TempDir& dir, const ModelConfig& config,
                                 const std::string& name, DType dtype, uint64_t seed) {
  auto out =
      dir.path() / (name + "-" + std::string(dtype_name(dtype)) + "-" + std::to_string(seed));
  MakeModelOptions options;
  options.seed = seed;
  options.dtype = dtype;
  Status status = make_random_checkpoint(config, out, options);
  EXPECT_TRUE(status.is_ok()) << status.to_string();
  return out;
}

std::filesystem::path make_preset_model(const TempDir& dir, const std::string& preset, DType dtype,
                                        uint64_t seed) {
  auto config = model_preset(preset);
  EXPECT_TRUE(config.is_ok()) << config.status().to_string();
  if (!config.is_ok()) return dir.path() / preset;
  return make_model(dir, *config, preset, dtype, seed);
}

}  // namespace baton::engine::testing
