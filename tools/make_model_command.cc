// tools/make_model_command.cc — `baton make-model`: random-weight checkpoints.
#include <cstdio>
#include <string>

#include "common/dtype.h"
#include "engine/make_model.h"
#include "tools/commands.h"

namespace baton::tools {

std::function<int()> add_make_model_command(CLI::App& app) {
  struct Options {
    std::string preset;
    std::string out_dir;
    uint64_t seed = 0;
    std::string dtype = "f32";
    std::string tokenizer_dir;
  };
  auto options = std::make_shared<Options>();
  auto* cmd = app.add_subcommand("make-model", "Write a random-weight Hugging Face checkpoint");
  std::string presets;
  for (const auto& name : engine::model_preset_names())
    presets += (presets.empty() ? "" : ", ") + name;
  cmd->add_option("--preset", options->preset, "model shape: " + presets)->required();
  cmd->add_option("--out", options->out_dir, "output directory")->required();
  cmd->add_option("--seed", options->seed, "random seed")->capture_default_str();
  cmd->add_option("--dtype", options->dtype, "weight dtype: f32, bf16 or f16")
      ->capture_default_str();
  cmd->add_option("--tokenizer", options->tokenizer_dir,
                  "directory with a real tokenizer.json (and tokenizer_config.json) to ship "
                  "instead of the byte tokenizer; its ids must fit the preset's vocabulary");

  return [options]() -> int {
    auto config = engine::model_preset(options->preset);
    if (!config.is_ok()) {
      std::fprintf(stderr, "error: --preset: %s\n", config.status().message().c_str());
      return 2;
    }
    auto dtype = parse_dtype(options->dtype);
    if (!dtype) {
      std::fprintf(stderr, "error: --dtype: expected f32, bf16 or f16, got '%s'\n",
                   options->dtype.c_str());
      return 2;
    }
    engine::MakeModelOptions make_options;
    make_options.seed = options->seed;
    make_options.dtype = *dtype;
    Status status = engine::make_random_checkpoint(*config, options->out_dir, make_options);
    if (status.is_ok() && !options->tokenizer_dir.empty()) {
      status = engine::attach_tokenizer(options->out_dir, options->tokenizer_dir)
                   .with_context("--tokenizer");
    }
    if (!status.is_ok()) {
      std::fprintf(stderr, "error: %s\n", status.to_string().c_str());
      return status.code() == StatusCode::kInvalidArgument ? 2 : 1;
    }
    std::printf("wrote %s (%s, %s, seed %llu)\n", options->out_dir.c_str(), options->preset.c_str(),
                options->dtype.c_str(), static_cast<unsigned long long>(options->seed));
    return 0;
  };
}

}  // namespace baton::tools
