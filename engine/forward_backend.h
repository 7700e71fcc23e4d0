// engine/forward_backend.h — the seam between the model and the hardware
// that runs it.
//
// LlamaModel turns a scheduler step into a StepBatch (flat host arrays) and
// hands it to a ForwardBackend, which runs every layer where it computes and
// returns the logits of the rows that want them, in host memory. Each
// backend owns its weights' copy (or view), its scratch, the KV pool's memory
// and the KV layout its attention reads; the block manager, prefix cache,
// transfer plans and SSD tier only ever see block ids and byte ranges of
// that layout. The seam is one step, not one op, so each backend fuses what
// its hardware rewards (the CPU joins q/k/v in one pass of its threads; a GPU
// runs one GEMM over concatenated weights) while the model's shape, the plan
// and its validation are written once.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "common/kv_layout.h"
#include "common/pool_copier.h"
#include "common/status.h"
#include "engine/device.h"
#include "engine/kv_pool.h"

namespace baton::engine {

class Checkpoint;

// One step, flattened: host memory, valid for the duration of forward().
struct StepBatch {
  int64_t num_tokens = 0;
  int32_t num_seqs = 0;
  const int32_t* token_ids = nullptr;     // [num_tokens], inside the vocabulary
  const int32_t* positions = nullptr;     // [num_tokens]
  const int32_t* slot_mapping = nullptr;  // [num_tokens]: block * block_size + offset
  const int32_t* query_start = nullptr;   // [num_seqs + 1]
  const int32_t* context_lens = nullptr;  // [num_seqs], this step's tokens included
  const int32_t* block_tables = nullptr;  // [num_seqs, block_table_stride]
  int32_t block_table_stride = 0;
  std::span<const int64_t> logit_rows;  // token rows whose logits are wanted, ascending
};

// Called with each layer's index once that layer's K/V of every token of the
// step is in the pool (on a device: the writes have completed), before the
// next layer writes anything.
using LayerDoneCallback = std::function<void(int32_t layer)>;

// The largest step an engine runs: what a backend sizes its workspace for.
struct StepLimits {
  int64_t tokens = 0;      // engine.max_num_batched_tokens
  int64_t logit_rows = 0;  // rows of logits, one a sequence (engine.max_num_seqs)
  int32_t block_size = 0;  // of the KV pool the steps read
};

class ForwardBackend {
 public:
  virtual ~ForwardBackend() = default;

  virtual Device device() const = 0;
  // The key order of the pools this backend's attention reads.
  virtual KeyOrder kv_key_order() const = 0;
  // The KV dtype for engine.kv_dtype `asked` (unset: auto) and the
  // checkpoint's dtype; one this backend cannot read is InvalidArgument.
  virtual Result<DType> kv_dtype(std::optional<DType> asked, DType checkpoint_dtype) const = 0;
  // A pool for `layout` (of kv_key_order()) in the memory the kernels read.
  virtual Result<KvPool> allocate_kv_pool(const KvLayout& layout) = 0;
  // Bytes the weights occupy where this backend reads them (the CPU's read
  // them in place from the mapped checkpoint).
  virtual uint64_t weights_bytes() const = 0;
  // Bytes of scratch the forward pass holds now, where it computes: the
  // activations of the largest step so far and the kernels' workspaces
  // (host memory for the CPU backend, the device's for the CUDA one). It
  // grows with the steps, so a node reports it with its load.
  virtual uint64_t workspace_bytes() const = 0;
  // Sizes the workspace for steps up to `limits` now, so that the first
  // such step does not find the memory taken by the pool, and
  // workspace_bytes() says what they hold. A larger step still grows it
  // (prompt logprobs want a row of logits a token).
  virtual Status reserve_workspace(const StepLimits& limits) = 0;
  // The memory the weights, the workspace and the KV pool share: the
  // device's, or this machine's (its cgroup's) for the CPU backend.
  virtual Result<uint64_t> memory_bytes() const = 0;
  // Copies byte ranges between `pool` (one of allocate_kv_pool's, outliving
  // the copier) and host memory of its layout: what stages the pool for the
  // transfer engine and the SSD tier where they cannot reach it in place.
  virtual Result<std::unique_ptr<PoolCopier>> make_pool_copier(KvPool& pool) = 0;
  // Runs the step: stores K/V of every token into `kv`, and writes
  // logits [batch.logit_rows.size(), vocab] (F32, host) in row order.
  virtual Status forward(const StepBatch& batch, KvPool& kv, std::vector<float>* logits,
                         const LayerDoneCallback* on_layer_done) = 0;
};

// The backend of `device` for `checkpoint` (which must outlive it). `threads`
// sizes the CPU backend's pool (0: one per hardware thread). A CUDA device in
// a build without CUDA, or one this machine does not have, is an error that
// says which.
Result<std::unique_ptr<ForwardBackend>> make_forward_backend(const Device& device,
                                                             const Checkpoint& checkpoint,
                                                             int32_t threads);

// OK when this build and machine can compute on `device`; otherwise the
// error make_forward_backend would return, found without loading anything
// (`baton up` asks before it starts a node).
Status check_device_present(const Device& device);

}  // namespace baton::engine
