// engine/cpu_forward.h — the CPU backend: the forward pass on kernels::cpu,
// over F32 activations, with weights read in place from the mapped
// checkpoint and the KV pool in host memory (grouped key order).
#pragma once

#include <chrono>
#include <memory>
#include <vector>

#include "engine/checkpoint.h"
#include "engine/forward_backend.h"
#include "kernels/cpu/thread_pool.h"

namespace baton::engine {

// Where a CPU step's wall time went, summed over the steps run while it was
// attached (CpuForward::set_profile): the dense projections (q/k/v, o,
// gate/up, down, LM head), attention (storing K/V and attending) and the
// rest (embedding, norms, RoPE, residual adds, SiLU).
struct CpuStepProfile {
  double projections_s = 0;
  double attention_s = 0;
  double other_s = 0;
};

class CpuForward final : public ForwardBackend {
 public:
  // Runs on `pool`, which must outlive the backend.
  CpuForward(const Checkpoint& checkpoint, kernels::cpu::ThreadPool& pool);
  // Runs on a pool of its own of `threads` threads (0: one per hardware thread).
  CpuForward(const Checkpoint& checkpoint, int32_t threads);

  Device device() const override { return Device{}; }
  KeyOrder kv_key_order() const override { return KeyOrder::kGrouped; }
  Result<DType> kv_dtype(std::optional<DType> asked, DType checkpoint_dtype) const override {
    return asked.value_or(checkpoint_dtype);
  }
  Result<KvPool> allocate_kv_pool(const KvLayout& layout) override;
  uint64_t weights_bytes() const override { return weights_bytes_; }
  // The step's own buffers (the kernels' per-thread scratch is not counted).
  uint64_t workspace_bytes() const override;
  // Reserves the step's buffers without touching them: the memory is the
  // host's, taken as steps first reach it.
  Status reserve_workspace(const StepLimits& limits) override;
  Result<uint64_t> memory_bytes() const override;
  Result<std::unique_ptr<PoolCopier>> make_pool_copier(KvPool& pool) override {
    return make_host_pool_copier(pool.data(), pool.bytes());
  }
  Status forward(const StepBatch& batch, KvPool& kv, std::vector<float>* logits,
                 const LayerDoneCallback* on_layer_done) override;

  // Adds every later step's phase times to *profile (null: stop). Costs a
  // clock read between kernels while attached.
  void set_profile(CpuStepProfile* profile) { profile_ = profile; }

 private:
  // The time since the last lap, added to `phase` of the attached profile.
  void lap(double CpuStepProfile::*phase);

  void attention_block(int32_t layer, const StepBatch& batch, KvPool& kv);
  void mlp_block(int32_t layer, int64_t tokens);
  // x += h (times Granite's residual_multiplier) for the step's tokens.
  void add_to_residual(int64_t tokens);

  const ModelConfig& config_;
  const ModelWeights& weights_;
  std::unique_ptr<kernels::cpu::ThreadPool> owned_pool_;
  kernels::cpu::ThreadPool& pool_;
  std::vector<float> inv_freq_;  // [head_dim / 2]
  uint64_t weights_bytes_;       // Checkpoint::weight_bytes()
  CpuStepProfile* profile_ = nullptr;
  std::chrono::steady_clock::time_point last_lap_;

  // Per-step scratch, grown on demand and reused: steps allocate nothing once warm.
  std::vector<float> x_;          // [tokens, hidden] residual stream
  std::vector<float> h_;          // [tokens, hidden] normed input / block output
  std::vector<float> q_;          // [tokens, heads * head_dim]
  std::vector<float> k_, v_;      // [tokens, kv_heads * head_dim]
  std::vector<float> attn_;       // [tokens, heads * head_dim]
  std::vector<float> gate_, up_;  // [tokens, intermediate]
};

}  // namespace baton::engine
