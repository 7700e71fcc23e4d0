#include "engine/engine.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdio>

#include "engine/host_memory.h"
#include "engine/memory_share.h"
#include "engine/window_budget.h"
#include "engine/yaml_settings.h"
#include "kernels/cpu/blas_setup.h"
#include "kernels/cpu/cpu_features.h"

namespace baton::engine {
namespace {

void log_huge_pages(const HugePageReport& report) {
  if (report.eligible_bytes == 0) return;
  const char* reread = report.reread ? ", after re-reading it from disk" : "";
  if (report.huge_bytes == report.eligible_bytes) {
    spdlog::info("engine: weights mapped in 2 MiB pages ({} MiB{})", report.huge_bytes >> 20,
                 reread);
  } else {
    spdlog::warn("engine: {} of {} MiB of weights mapped in 2 MiB pages{}: {}",
                 report.huge_bytes >> 20, report.eligible_bytes >> 20, reread, report.note);
  }
}

}  // namespace

Result<std::unique_ptr<Engine>> Engine::create(const std::filesystem::path& model_dir,
                                               const EngineConfig& config,
                                               const KvPoolAllocator& allocate_pool) {
  std::unique_ptr<Checkpoint> checkpoint;
  // Huge pages serve the CPU kernels, which read the weights every step; a
  // device backend reads them once, to upload them.
  if (config.huge_page_weights && !config.device.is_cuda()) {
    HugePageReport huge;
    BATON_ASSIGN_OR_RETURN(checkpoint, Checkpoint::open_in_huge_pages(model_dir, huge));
    log_huge_pages(huge);
  } else {
    BATON_ASSIGN_OR_RETURN(checkpoint, Checkpoint::open(model_dir));
  }
  const ModelConfig& model_config = checkpoint->config();

  // A device pool is the backend's to allocate. Refused before the backend
  // uploads any weights.
  if (config.device.is_cuda() && allocate_pool) {
    return invalid_argument("engine.device " + config.device.name() +
                            ": the KV pool of a device is allocated on the device, not by the "
                            "transfer engine");
  }
  if (config.cpu_bf16_dot) {
    kernels::cpu::set_avx512_bf16_preferred(*config.cpu_bf16_dot);
    if (*config.cpu_bf16_dot && !kernels::cpu::cpu_has_avx512_bf16())
      spdlog::warn("engine.cpu_bf16_dot: true, but this CPU has no AVX-512 BF16: F32 FMAs run");
  }
  if (!config.device.is_cuda()) {
    // Before the name is read: in a program that did not call it first,
    // OpenBLAS would otherwise still report the kernels it chose on load.
    kernels::cpu::setup_blas();
    spdlog::info("engine: CPU kernels {}{}; OpenBLAS kernels {}", kernels::cpu::kernel_isa_name(),
                 kernels::cpu::max_cpu_isa() < kernels::cpu::MaxCpuIsa::kAmx
                     ? " (capped by BATON_MAX_CPU_ISA)"
                     : "",
                 kernels::cpu::blas_core_name());
  }
  BATON_ASSIGN_OR_RETURN(std::unique_ptr<ForwardBackend> backend,
                         make_forward_backend(config.device, *checkpoint, config.threads));
  BATON_ASSIGN_OR_RETURN(DType kv_dtype,
                         backend->kv_dtype(config.kv_dtype, model_config.torch_dtype));
  KvLayout layout =
      kv_layout_of(model_config, config.block_size, kv_dtype, backend->kv_key_order());
  // Before the pool: the largest step's workspace is then known, and never
  // finds its memory taken by the pool.
  BATON_RETURN_IF_ERROR(backend->reserve_workspace({.tokens = config.max_num_batched_tokens,
                                                    .logit_rows = config.max_num_seqs,
                                                    .block_size = config.block_size}));
  uint64_t pool_bytes = config.kv_cache_bytes;
  if (config.sized_by_memory_fraction()) {
    BATON_ASSIGN_OR_RETURN(const uint64_t memory, backend->memory_bytes());
    const MemoryShare share{.fraction = config.memory_fraction,
                            .memory = memory,
                            .weights = backend->weights_bytes(),
                            .workspace = backend->workspace_bytes()};
    BATON_ASSIGN_OR_RETURN(pool_bytes, pool_bytes_of_share(share, config.device.name()));
    spdlog::info("engine: memory_fraction {:g} of {}'s {}: weights {}, workspace {}, KV pool {}",
                 config.memory_fraction, config.device.name(), bytes_text(memory),
                 bytes_text(share.weights), bytes_text(share.workspace), bytes_text(pool_bytes));
  }
  const int64_t blocks =
      config.kv_cache_blocks > 0 ? config.kv_cache_blocks : kv_blocks_for_bytes(layout, pool_bytes);
  if (blocks < 1) {
    return invalid_argument(std::string(config.pool_size_setting()) + ": " +
                            std::to_string(pool_bytes) + " bytes hold no KV block of " +
                            std::to_string(layout.bytes_per_token() * size_t(layout.block_size)) +
                            " bytes");
  }
  // Token slots (block * block_size + offset) are int32 in the kernels.
  layout.num_blocks = int32_t(std::min<int64_t>(blocks, INT32_MAX / config.block_size));
  if (config.sized_by_memory_fraction()) {
    // A share is sized here, where the memory is known, not by `baton up`:
    // one that cannot hold a request is refused, rather than capping the
    // context below what the router admits.
    const int64_t max_len =
        config.max_model_len > 0 ? config.max_model_len : model_config.max_position_embeddings;
    const int64_t held = tokens_held_at_once(max_len, model_config.kv_window(),
                                             config.max_num_batched_tokens, config.block_size);
    const int64_t pool_tokens = int64_t(layout.num_blocks) * config.block_size;
    if (pool_tokens < held) {
      return invalid_argument(
          "engine.memory_fraction: " + format_fraction(config.memory_fraction) + " of " +
          config.device.name() + "'s memory leaves a KV pool of " + bytes_text(pool_bytes) + ", " +
          std::to_string(pool_tokens) + " tokens at " + std::to_string(layout.bytes_per_token()) +
          " bytes a token, less than the " + std::to_string(held) +
          " tokens one request holds at once (" +
          (config.max_model_len > 0 ? "engine.max_model_len"
                                    : "the model's max_position_embeddings") +
          " " + std::to_string(max_len) + "): raise the fraction or lower engine.max_model_len");
    }
  }
  if (!config.device.is_cuda()) {
    BATON_RETURN_IF_ERROR(check_fits_host_memory(
        layout.total_bytes(), std::string(config.pool_size_setting()) + ": a KV pool of " +
                                  gib_text(layout.total_bytes()) + " (" +
                                  std::to_string(layout.num_blocks) + " blocks)"));
  }
  auto make_pool = [&]() -> Result<KvPool> {
    if (!allocate_pool) return backend->allocate_kv_pool(layout);
    BATON_ASSIGN_OR_RETURN(void* memory, allocate_pool(layout));
    return KvPool::adopt(layout, memory);
  };
  Result<KvPool> made = make_pool();
  if (!made.is_ok()) return made.status().with_context(config.pool_size_setting());
  KvPool pool = std::move(made).value();

  std::unique_ptr<Engine> engine(new Engine(config, std::move(pool)));
  engine->checkpoint_ = std::move(checkpoint);
  auto tokenizer = load_tokenizer(model_dir);
  if (tokenizer.is_ok()) {
    engine->tokenizer_ = std::move(tokenizer).value();
  } else if (tokenizer.status().code() == StatusCode::kUnimplemented) {
    // A tokenizer of a kind Baton does not implement yet: the model still
    // serves token ids, and text is refused as for a checkpoint without one.
    spdlog::warn("engine: {}; text prompts are refused, token ids still work",
                 tokenizer.status().message());
  } else if (tokenizer.status().code() != StatusCode::kNotFound) {
    return tokenizer.status();
  }
  engine->model_ = std::make_unique<LlamaModel>(*engine->checkpoint_, std::move(backend));
  SchedulerConfig scheduler_config{.max_num_seqs = config.max_num_seqs,
                                   .max_num_batched_tokens = config.max_num_batched_tokens,
                                   .max_model_len = config.max_model_len,
                                   .enable_prefix_caching = config.enable_prefix_caching};
  engine->scheduler_ =
      std::make_unique<Scheduler>(*engine->model_, engine->kv_pool_, scheduler_config);
  if (!config.ssd_cache_dir.empty()) {
    if (!config.enable_prefix_caching) {
      return invalid_argument(
          "engine.ssd_cache_dir: the SSD tier needs engine.enable_prefix_caching");
    }
    auto store =
        SsdKvStore::create(config.ssd_cache_dir, config.ssd_cache_bytes, engine->kv_pool_.layout());
    if (!store.is_ok()) return store.status();
    // The store reads and writes with the CPU: a device pool is staged.
    std::unique_ptr<PoolCopier> staging;
    if (engine->kv_pool_.on_device()) {
      BATON_ASSIGN_OR_RETURN(staging, engine->make_pool_copier());
    }
    BATON_RETURN_IF_ERROR(
        engine->scheduler_->attach_ssd_store(std::move(store).value(), std::move(staging)));
  }
  spdlog::info(
      "engine: on {}, {} layers, {} heads / {} KV heads, KV pool {} blocks x {} tokens ({} MiB, "
      "{} at {} bytes a token)",
      config.device.name(), model_config.num_layers, model_config.num_heads,
      model_config.num_kv_heads, layout.num_blocks, layout.block_size,
      engine->kv_pool_.bytes() >> 20, dtype_name(layout.dtype), layout.bytes_per_token());
  return engine;
}

Result<std::unique_ptr<PoolCopier>> Engine::make_pool_copier() {
  return model_->backend().make_pool_copier(kv_pool_);
}

Result<std::vector<std::unique_ptr<Sequence>>> Engine::run_to_completion() {
  std::vector<std::unique_ptr<Sequence>> done;
  while (scheduler_->has_work()) {
    BATON_RETURN_IF_ERROR(scheduler_->step(nullptr));
    const auto& counts = scheduler_->last_step();
    if (counts.prompt_tokens + counts.recomputed_tokens + counts.generated_tokens == 0 &&
        scheduler_->has_work()) {
      // Only sequences awaiting remote KV can make a step schedule nothing
      // and leave work behind (a step that only landed an aborted
      // sequence's SSD reads leaves none).
      return resource_exhausted(
          "queued sequences need KV blocks that sequences awaiting remote KV hold");
    }
    for (auto& seq : scheduler_->take_finished()) done.push_back(std::move(seq));
  }
  for (auto& seq : scheduler_->take_finished()) done.push_back(std::move(seq));
  std::sort(done.begin(), done.end(), [](const auto& a, const auto& b) { return a->id < b->id; });
  return done;
}

}  // namespace baton::engine
