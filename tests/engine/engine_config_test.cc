#include "engine/engine_config.h"
#include "engine/yaml_settings.h"

#include <gtest/gtest.h>

#include <yaml-cpp/yaml.h>
#include <random>

#include <tuple>

namespace baton::engine {
namespace {

Result<EngineConfig> parse(const std::string& yaml) {
  return parse_engine_config(YAML::Load(yaml), "engine");
}

TEST(EngineConfig, MissingMeansDefault) {
  auto config = parse("{}");
  ASSERT_TRUE(config.is_ok());
  EXPECT_EQ(config->block_size, 16);
  EXPECT_EQ(config->device, Device{});
  EXPECT_FALSE(config->kv_dtype.has_value());
  EXPECT_EQ(config->kv_cache_bytes, 256ull << 20);
  EXPECT_TRUE(config->huge_page_weights);
  EXPECT_TRUE(config->enable_prefix_caching);
  EXPECT_TRUE(config->ssd_cache_dir.empty());
  EXPECT_EQ(config->ssd_cache_bytes, 4ull << 30);
  EXPECT_EQ(config->nice, 0);
  EXPECT_EQ(config->min_step_interval, std::chrono::milliseconds(0));
  EXPECT_FALSE(config->cpu_bf16_dot.has_value());
  EXPECT_EQ(config->memory_fraction, 0.0);
}

TEST(EngineConfig, ReadsEveryKey) {
  auto config = parse(
      "{device: 'cuda:1', threads: 3, block_size: 32, kv_dtype: bf16, kv_cache_bytes: 2GiB, "
      "kv_cache_blocks: 7,"
      " max_num_seqs: 9, max_num_batched_tokens: 512, max_model_len: 1024,"
      " huge_page_weights: false, enable_prefix_caching: false, ssd_cache_dir: /var/cache/kv,"
      " ssd_cache_bytes: 64GiB, nice: 10, cpu_bf16_dot: false, min_step_interval_ms: 25,"
      " memory_fraction: 0.45}");
  ASSERT_TRUE(config.is_ok()) << config.status().to_string();
  EXPECT_EQ(config->device, (Device{.kind = Device::Kind::kCuda, .index = 1}));
  EXPECT_EQ(config->device.name(), "cuda:1");
  EXPECT_EQ(config->threads, 3);
  EXPECT_EQ(config->block_size, 32);
  EXPECT_EQ(config->kv_dtype, DType::kBF16);
  EXPECT_EQ(config->kv_cache_bytes, 2ull << 30);
  EXPECT_EQ(config->kv_cache_blocks, 7);
  EXPECT_EQ(config->max_num_seqs, 9);
  EXPECT_EQ(config->max_num_batched_tokens, 512);
  EXPECT_EQ(config->max_model_len, 1024);
  EXPECT_FALSE(config->huge_page_weights);
  EXPECT_FALSE(config->enable_prefix_caching);
  EXPECT_EQ(config->ssd_cache_dir, "/var/cache/kv");
  EXPECT_EQ(config->ssd_cache_bytes, 64ull << 30);
  EXPECT_EQ(config->nice, 10);
  EXPECT_EQ(config->min_step_interval, std::chrono::milliseconds(25));
  EXPECT_EQ(config->cpu_bf16_dot, false);
  EXPECT_EQ(config->memory_fraction, 0.45);
  EXPECT_EQ(parse("{memory_fraction: 1}")->memory_fraction, 1.0);
  EXPECT_EQ(parse("{memory_fraction: 0}")->memory_fraction, 0.0);
  EXPECT_EQ(parse("{cpu_bf16_dot: true}")->cpu_bf16_dot, true);
  EXPECT_FALSE(parse("{cpu_bf16_dot: auto}")->cpu_bf16_dot.has_value());
}

TEST(EngineConfig, DeviceSpellings) {
  for (const auto& [text, kind, index] :
       {std::tuple{"cpu", Device::Kind::kCpu, 0}, std::tuple{"cuda", Device::Kind::kCuda, 0},
        std::tuple{"cuda:0", Device::Kind::kCuda, 0},
        std::tuple{"cuda:7", Device::Kind::kCuda, 7}}) {
    auto device = parse_device(text, "engine.device");
    ASSERT_TRUE(device.is_ok()) << text;
    EXPECT_EQ(device->kind, kind) << text;
    EXPECT_EQ(device->index, index) << text;
  }
  for (const char* text : {"", "CPU", "cuda0", "cuda:", "cuda: 1", "cuda:99999999999", "rocm"}) {
    auto device = parse_device(text, "engine.device");
    ASSERT_FALSE(device.is_ok()) << text;
    EXPECT_NE(device.status().message().find(std::string("'") + text + "'"), std::string::npos)
        << device.status().message();
  }
}

TEST(EngineConfig, ErrorsNameTheKey) {
  struct Case {
    const char* yaml;
    const char* key;
  } cases[] = {
      {"{blok_size: 16}", "engine.blok_size: unknown key"},
      {"{device: gpu}", "engine.device: expected cpu, cuda or cuda:N, got 'gpu'"},
      {"{device: 'cuda:'}", "engine.device"},
      {"{device: 'cuda:-1'}", "engine.device"},
      {"{device: 'cuda:1x'}", "engine.device"},
      {"{device: [cuda]}", "engine.device"},
      {"{block_size: 24}", "engine.block_size: must be a power of two"},
      {"{block_size: 0}", "engine.block_size"},
      {"{block_size: abc}", "engine.block_size: expected an integer"},
      {"{kv_dtype: f64}", "engine.kv_dtype"},
      {"{kv_cache_bytes: 12XB}", "engine.kv_cache_bytes"},
      {"{kv_cache_bytes: 0}", "engine.kv_cache_bytes"},
      {"{max_num_seqs: 0}", "engine.max_num_seqs"},
      {"{threads: -1}", "engine.threads"},
      {"{huge_page_weights: maybe}", "engine.huge_page_weights: expected true or false"},
      {"{enable_prefix_caching: 1}", "engine.enable_prefix_caching: expected true or false"},
      {"{ssd_cache_dir: [a, b]}", "engine.ssd_cache_dir: expected a directory path"},
      {"{ssd_cache_bytes: 0}", "engine.ssd_cache_bytes: must be positive"},
      {"{ssd_cache_bytes: lots}", "engine.ssd_cache_bytes"},
      {"{nice: -5}", "engine.nice: must be in [0, 19]"},
      {"{nice: 20}", "engine.nice: must be in [0, 19]"},
      {"{min_step_interval_ms: -1}", "engine.min_step_interval_ms: must be in [0, 10000]"},
      {"{min_step_interval_ms: 10001}", "engine.min_step_interval_ms: must be in [0, 10000]"},
      {"{memory_fraction: 1.5}", "engine.memory_fraction: must be in [0, 1], got 1.5"},
      {"{memory_fraction: -0.1}", "engine.memory_fraction: must be in [0, 1]"},
      {"{memory_fraction: nan}", "engine.memory_fraction: must be in [0, 1]"},
      {"{memory_fraction: 45%}", "engine.memory_fraction: expected a number in [0, 1]"},
      {"{memory_fraction: ''}", "engine.memory_fraction: expected a number in [0, 1]"},
      {"{memory_fraction: [0.5]}", "engine.memory_fraction: expected a number in [0, 1]"},
      {"{cpu_bf16_dot: yes}", "engine.cpu_bf16_dot: expected auto, true or false"},
      {"[1, 2]", "engine: expected a mapping"},
      {"{threads: 1, threads: 2}", "engine.threads: given twice"},
  };
  for (const auto& c : cases) {
    auto config = parse(c.yaml);
    ASSERT_FALSE(config.is_ok()) << c.yaml;
    EXPECT_EQ(config.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(config.status().message().find(c.key), std::string::npos)
        << c.yaml << " -> " << config.status().message();
  }
}

TEST(EngineConfig, ByteSizes) {
  EXPECT_EQ(*parse_byte_size("512MiB", "k"), 512ull << 20);
  EXPECT_EQ(*parse_byte_size("3 GB", "k"), 3000000000ull);
  EXPECT_EQ(*parse_byte_size("4096", "k"), 4096ull);
  EXPECT_FALSE(parse_byte_size("MiB", "k").is_ok());
  EXPECT_FALSE(parse_byte_size("99999999999999999999", "k").is_ok());
  EXPECT_FALSE(parse_byte_size("20000000000TiB", "k").is_ok());
  std::mt19937_64 rng(std::random_device{}());
  for (int i = 0; i < 200; ++i) {
    const uint64_t bytes = (rng() % 5000 + 1) << (rng() % 4 * 10);
    EXPECT_EQ(*parse_byte_size(format_byte_size(bytes), "k"), bytes) << format_byte_size(bytes);
  }
  EXPECT_EQ(format_byte_size(256ull << 20), "256MiB");
  EXPECT_EQ(format_byte_size(1000), "1000");
}

// The reference (`baton generate --help`) shows every setting once, its
// default read from EngineConfig's own initializers.
TEST(EngineConfig, ReferenceShowsEverySettingsDefault) {
  const std::string reference = engine_config_reference();
  const EngineConfig defaults;
  for (const std::string& key : engine_config_keys()) {
    const std::string line = "engine." + key + " (default ";
    EXPECT_NE(reference.find(line), std::string::npos) << key;
    EXPECT_EQ(reference.find(line), reference.rfind(line)) << key << " shown twice";
  }
  for (const std::string& shown :
       {"engine.kv_cache_bytes (default " + format_byte_size(defaults.kv_cache_bytes) + ")",
        "engine.max_num_seqs (default " + std::to_string(defaults.max_num_seqs) + ")",
        std::string("engine.enable_prefix_caching (default ") +
            (defaults.enable_prefix_caching ? "true" : "false") + ")",
        std::string("engine.kv_dtype (default auto)"), std::string("engine.device (default cpu)")})
    EXPECT_NE(reference.find(shown), std::string::npos) << shown;
}

}  // namespace
}  // namespace baton::engine
