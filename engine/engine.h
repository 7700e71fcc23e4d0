// engine/engine.h — the engine assembled: checkpoint, tokenizer, model on
// its device's backend, KV pool and scheduler, built from an EngineConfig.
// Prefill and decode nodes each own one; `baton generate` drives one directly.
#pragma once

#include <filesystem>
#include <functional>
#include <memory>
#include <vector>

#include "common/status.h"
#include "engine/checkpoint.h"
#include "engine/engine_config.h"
#include "engine/kv_pool.h"
#include "engine/model.h"
#include "engine/scheduler.h"
#include "engine/tokenizer.h"

namespace baton::engine {

// Provides the KV pool's memory for a layout: layout.total_bytes(), owned by
// the provider and outliving every use of the engine. Its contents do not
// matter: a slot is always written before attention reads it.
using KvPoolAllocator = std::function<Result<void*>(const KvLayout& layout)>;

class Engine {
 public:
  // Without `allocate_pool` the engine maps its own pool.
  static Result<std::unique_ptr<Engine>> create(const std::filesystem::path& model_dir,
                                                const EngineConfig& config,
                                                const KvPoolAllocator& allocate_pool = {});

  const EngineConfig& config() const { return config_; }
  const Checkpoint& checkpoint() const { return *checkpoint_; }
  const ModelConfig& model_config() const { return checkpoint_->config(); }
  // Null when the checkpoint ships no tokenizer (token ids still work).
  const Tokenizer* tokenizer() const { return tokenizer_.get(); }
  LlamaModel& model() { return *model_; }
  KvPool& kv_pool() { return kv_pool_; }
  Scheduler& scheduler() { return *scheduler_; }
  // A copier between the KV pool and host memory of its layout
  // (ForwardBackend::make_pool_copier); it must not outlive the engine.
  Result<std::unique_ptr<PoolCopier>> make_pool_copier();

  // Steps until every queued sequence has finished; returns them by id order.
  // Sequences awaiting remote KV are not waited for; ResourceExhausted if the
  // blocks they hold keep the queued ones from running.
  Result<std::vector<std::unique_ptr<Sequence>>> run_to_completion();

 private:
  Engine(EngineConfig config, KvPool pool) : config_(config), kv_pool_(std::move(pool)) {}

  EngineConfig config_;
  std::unique_ptr<Checkpoint> checkpoint_;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::unique_ptr<LlamaModel> model_;
  KvPool kv_pool_;
  std::unique_ptr<Scheduler> scheduler_;
};

}  // namespace baton::engine
