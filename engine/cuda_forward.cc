#include "engine/cuda_forward.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include "kernels/cpu/convert.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/llama_ops.h"
#include "kernels/cuda/paged_attention.h"
#include "kernels/cuda/pool_copier.h"
#include "kernels/cuda/stream.h"

namespace baton::engine {
namespace {

namespace kc = kernels::cuda;
using kernels::cpu::WeightView;

constexpr size_t kBf16 = 2;

// Rows of several host matrices of one width, converted to BF16 and stacked
// into one device matrix (q/k/v, gate/up); a single matrix is a stack of one.
Result<kc::DeviceBuffer> upload_stacked(std::span<const WeightView> parts) {
  int64_t rows = 0;
  for (const auto& w : parts) rows += w.rows;
  const int64_t cols = parts.front().cols;
  BATON_ASSIGN_OR_RETURN(kc::DeviceBuffer device,
                         kc::DeviceBuffer::allocate(size_t(rows * cols) * kBf16));
  std::vector<float> row_f32(static_cast<size_t>(cols));
  std::vector<bf16_t> staged;
  size_t offset = 0;
  for (const auto& w : parts) {
    staged.resize(size_t(w.rows * cols));
    const size_t row_bytes = size_t(cols) * dtype_size(w.dtype);
    for (int64_t r = 0; r < w.rows; ++r) {
      const void* src = static_cast<const char*>(w.data) + size_t(r) * row_bytes;
      bf16_t* dst = staged.data() + size_t(r * cols);
      if (w.dtype == DType::kBF16) {
        std::memcpy(dst, src, size_t(cols) * kBf16);
      } else {
        kernels::cpu::convert_to_f32(src, w.dtype, cols, row_f32.data());
        for (int64_t c = 0; c < cols; ++c) dst[c] = float_to_bf16(row_f32[size_t(c)]);
      }
    }
    BATON_RETURN_IF_ERROR(device.copy_from_host(staged.data(), staged.size() * kBf16, offset));
    offset += staged.size() * kBf16;
  }
  return device;
}

// F32 vectors (norm weights, biases) stacked and converted to BF16.
Result<kc::DeviceBuffer> upload_vectors(std::span<const std::vector<float>* const> parts) {
  std::vector<bf16_t> staged;
  for (const auto* v : parts) {
    for (float f : *v) staged.push_back(float_to_bf16(f));
  }
  BATON_ASSIGN_OR_RETURN(kc::DeviceBuffer device,
                         kc::DeviceBuffer::allocate(std::max<size_t>(staged.size(), 1) * kBf16));
  BATON_RETURN_IF_ERROR(device.copy_from_host(staged.data(), staged.size() * kBf16));
  return device;
}

// A device buffer that grows to the largest request and is then reused.
// The old one goes first, so that growing never holds both (device memory
// is sized tight around the KV pool); its contents are not kept.
Status ensure(kc::DeviceBuffer& buffer, size_t bytes) {
  if (buffer.bytes() >= bytes) return Status::ok();
  const size_t grown = std::max(bytes, buffer.bytes() * 2);
  buffer = kc::DeviceBuffer();
  BATON_ASSIGN_OR_RETURN(buffer, kc::DeviceBuffer::allocate(grown));
  return Status::ok();
}

Status ensure(kc::PinnedBuffer& buffer, size_t bytes) {
  if (buffer.bytes() >= bytes) return Status::ok();
  BATON_ASSIGN_OR_RETURN(buffer, kc::PinnedBuffer::allocate(std::max(bytes, buffer.bytes() * 2)));
  return Status::ok();
}

struct LayerOnDevice {
  kc::DeviceBuffer qkv, qkv_bias, o, o_bias, gate_up, down, input_norm, post_attention_norm;
  kc::DeviceBuffer q_norm, k_norm;  // Qwen3's, [head_dim] each
};

class CudaForward final : public ForwardBackend {
 public:
  CudaForward(int32_t index, const Checkpoint& checkpoint)
      : index_(index), config_(checkpoint.config()) {}

  Status load(const Checkpoint& checkpoint) {
    const ModelConfig& c = config_;
    const ModelWeights& w = checkpoint.weights();
    const size_t weights_bytes = weight_bytes(w);
    BATON_RETURN_IF_ERROR(check_fits("the weights (bf16)", weights_bytes));
    q_width_ = int64_t(c.num_heads) * c.head_dim;
    kv_width_ = int64_t(c.num_kv_heads) * c.head_dim;
    qkv_width_ = q_width_ + 2 * kv_width_;
    BATON_ASSIGN_OR_RETURN(stream_, kc::Stream::create());
    BATON_ASSIGN_OR_RETURN(layer_done_, kc::Event::create());
    BATON_ASSIGN_OR_RETURN(gemm_, kc::Gemm::create(gemm_workspace_bytes_));
    const WeightView embed[] = {w.embed_tokens};
    BATON_ASSIGN_OR_RETURN(embed_tokens_, upload_stacked(embed));
    tied_ = w.lm_head.data == w.embed_tokens.data;
    if (!tied_) {
      const WeightView head[] = {w.lm_head};
      BATON_ASSIGN_OR_RETURN(lm_head_, upload_stacked(head));
    }
    const std::vector<float>* final_norm[] = {&w.final_norm};
    BATON_ASSIGN_OR_RETURN(final_norm_, upload_vectors(final_norm));
    for (const auto& l : w.layers) {
      LayerOnDevice d;
      const WeightView qkv[] = {l.q_proj, l.k_proj, l.v_proj};
      BATON_ASSIGN_OR_RETURN(d.qkv, upload_stacked(qkv));
      if (!l.q_bias.empty()) {
        const std::vector<float>* bias[] = {&l.q_bias, &l.k_bias, &l.v_bias};
        BATON_ASSIGN_OR_RETURN(d.qkv_bias, upload_vectors(bias));
      }
      const WeightView o[] = {l.o_proj}, gate_up[] = {l.gate_proj, l.up_proj},
                       down[] = {l.down_proj};
      BATON_ASSIGN_OR_RETURN(d.o, upload_stacked(o));
      if (!l.o_bias.empty()) {
        const std::vector<float>* bias[] = {&l.o_bias};
        BATON_ASSIGN_OR_RETURN(d.o_bias, upload_vectors(bias));
      }
      if (!l.q_norm.empty()) {
        const std::vector<float>*q_norm[] = {&l.q_norm}, *k_norm[] = {&l.k_norm};
        BATON_ASSIGN_OR_RETURN(d.q_norm, upload_vectors(q_norm));
        BATON_ASSIGN_OR_RETURN(d.k_norm, upload_vectors(k_norm));
      }
      BATON_ASSIGN_OR_RETURN(d.gate_up, upload_stacked(gate_up));
      BATON_ASSIGN_OR_RETURN(d.down, upload_stacked(down));
      const std::vector<float>*in[] = {&l.input_norm}, *post[] = {&l.post_attention_norm};
      BATON_ASSIGN_OR_RETURN(d.input_norm, upload_vectors(in));
      BATON_ASSIGN_OR_RETURN(d.post_attention_norm, upload_vectors(post));
      layers_.push_back(std::move(d));
    }
    weights_bytes_ = weights_bytes;
    return upload_rope_table(config_.max_position_embeddings);
  }

  uint64_t weights_bytes() const override { return weights_bytes_; }

  Status reserve_workspace(const StepLimits& limits) override {
    BATON_RETURN_IF_ERROR(kc::use_device(index_));
    BATON_RETURN_IF_ERROR(ensure_attention(limits.block_size));
    const int64_t tokens = std::max<int64_t>(limits.tokens, 1);
    return size_step_buffers(tokens, std::min(limits.logit_rows, tokens));
  }

  Result<uint64_t> memory_bytes() const override {
    BATON_RETURN_IF_ERROR(kc::use_device(index_));
    BATON_ASSIGN_OR_RETURN(kc::DeviceMemory memory, kc::device_memory());
    return uint64_t(memory.total_bytes);
  }

  uint64_t workspace_bytes() const override {
    uint64_t bytes = gemm_workspace_bytes_ + rope_.bytes() + step_ints_.bytes() +
                     (attention_ ? kc::kPagedAttentionWorkspaceBytes : 0);
    for (const kc::DeviceBuffer* b :
         {&x_, &h_, &qkv_, &q_, &attn_, &gate_up_, &act_, &rows_, &logits_})
      bytes += b->bytes();
    return bytes;
  }

  Device device() const override { return Device{.kind = Device::Kind::kCuda, .index = index_}; }
  KeyOrder kv_key_order() const override { return KeyOrder::kTokenMajor; }

  Result<DType> kv_dtype(std::optional<DType> asked, DType) const override {
    if (asked && *asked != DType::kBF16) {
      return invalid_argument("engine.kv_dtype: the CUDA backend keeps KV in bf16, not " +
                              std::string(dtype_name(*asked)));
    }
    return DType::kBF16;
  }

  Result<KvPool> allocate_kv_pool(const KvLayout& layout) override {
    if (layout.key_order != KeyOrder::kTokenMajor || layout.dtype != DType::kBF16) {
      return invalid_argument("the CUDA backend's KV pool is BF16 and token-major");
    }
    BATON_RETURN_IF_ERROR(kc::use_device(index_));
    // Without reserve_workspace, the attention's workspaces come at the
    // first step: room is left for them, so that step does not run out.
    const bool attention_ready =
        attention_ != nullptr && attention_shape_block_ == layout.block_size;
    BATON_RETURN_IF_ERROR(check_fits(
        "the KV pool's " + std::to_string(layout.num_blocks) + " blocks" +
            (attention_ready ? std::string() : " and the attention's workspaces"),
        layout.total_bytes() + (attention_ready ? 0 : kc::kPagedAttentionWorkspaceBytes)));
    BATON_ASSIGN_OR_RETURN(kc::DeviceBuffer memory,
                           kc::DeviceBuffer::allocate(layout.total_bytes()));
    // Zero, as a CPU pool starts (mapped pages): no slot read before it is
    // written can hold a NaN that a masked-out product would spread.
    BATON_RETURN_IF_ERROR(memory.zero());
    auto owner = std::make_shared<kc::DeviceBuffer>(std::move(memory));
    void* data = owner->data();
    return KvPool::adopt_device(layout, data, [owner](void*) mutable { owner.reset(); });
  }

  Result<std::unique_ptr<PoolCopier>> make_pool_copier(KvPool& pool) override {
    if (!pool.on_device()) return invalid_argument("the CUDA backend's pools are on the device");
    BATON_RETURN_IF_ERROR(kc::use_device(index_));
    return kc::make_pool_copier(pool.data(), pool.bytes());
  }

  Status forward(const StepBatch& batch, KvPool& kv, std::vector<float>* logits,
                 const LayerDoneCallback* on_layer_done) override {
    if (!kv.on_device()) return invalid_argument("the CUDA backend needs a device KV pool");
    BATON_RETURN_IF_ERROR(kc::use_device(index_));
    if (batch.num_tokens == 0) {
      logits->clear();
      return Status::ok();
    }
    Status status = run_step(batch, kv, logits, on_layer_done);
    // A step that failed part-way may have copies queued from the pinned
    // buffers the next step refills: let them finish first.
    if (!status.is_ok()) (void)stream_.synchronize();
    return status;
  }

 private:
  // Bytes of the checkpoint's matrices and vectors once uploaded as BF16.
  static size_t weight_bytes(const ModelWeights& w) {
    auto matrix = [](const WeightView& v) { return size_t(v.rows) * size_t(v.cols) * kBf16; };
    size_t bytes = matrix(w.embed_tokens) + w.final_norm.size() * kBf16;
    if (w.lm_head.data != w.embed_tokens.data) bytes += matrix(w.lm_head);
    for (const auto& l : w.layers) {
      for (const WeightView* m :
           {&l.q_proj, &l.k_proj, &l.v_proj, &l.o_proj, &l.gate_proj, &l.up_proj, &l.down_proj})
        bytes += matrix(*m);
      bytes +=
          (l.q_bias.size() + l.k_bias.size() + l.v_bias.size() + l.o_bias.size() + l.q_norm.size() +
           l.k_norm.size() + l.input_norm.size() + l.post_attention_norm.size()) *
          kBf16;
    }
    return bytes;
  }

  // `what` needs `bytes` of this device: refused with the numbers when they
  // are not free, rather than by a cudaMalloc that says only "out of memory".
  Status check_fits(const std::string& what, size_t bytes) const {
    BATON_ASSIGN_OR_RETURN(kc::DeviceMemory memory, kc::device_memory());
    if (bytes <= memory.free_bytes) return Status::ok();
    auto gib = [](size_t b) {
      char text[32];
      std::snprintf(text, sizeof text, "%.2f GiB", double(b) / double(1ull << 30));
      return std::string(text);
    };
    return resource_exhausted(
        "engine.device cuda:" + std::to_string(index_) + ": " + what + " need " + gib(bytes) +
        ", and the device has " + gib(memory.free_bytes) + " free of " + gib(memory.total_bytes) +
        (weights_bytes_ > 0 ? " (this node's weights hold " + gib(weights_bytes_) + ")"
                            : std::string()));
  }

  // The attention of pools of `block_size` tokens a block, with its workspaces.
  Status ensure_attention(int32_t block_size) {
    if (attention_ != nullptr && attention_shape_block_ == block_size) return Status::ok();
    attention_.reset();  // its workspaces go before the new one's are taken
    const ModelConfig& c = config_;
    BATON_ASSIGN_OR_RETURN(attention_,
                           kc::PagedAttention::create({.num_heads = c.num_heads,
                                                       .num_kv_heads = c.num_kv_heads,
                                                       .head_dim = c.head_dim,
                                                       .block_size = block_size,
                                                       .layer_windows = c.layer_windows}));
    attention_shape_block_ = block_size;
    return Status::ok();
  }

  // The activations, logits and staged integers of a step of `tokens`
  // tokens wanting `wanted` rows of logits.
  Status size_step_buffers(int64_t tokens, int64_t wanted) {
    const int64_t hidden = config_.hidden_size, ffn = config_.intermediate_size,
                  vocab = config_.vocab_size;
    const int64_t rows = std::max<int64_t>(wanted, 1);
    BATON_RETURN_IF_ERROR(ensure(x_, size_t(tokens * hidden) * kBf16));
    BATON_RETURN_IF_ERROR(ensure(h_, size_t(tokens * hidden) * kBf16));
    BATON_RETURN_IF_ERROR(ensure(qkv_, size_t(tokens * qkv_width_) * kBf16));
    BATON_RETURN_IF_ERROR(ensure(q_, size_t(tokens * q_width_) * kBf16));
    BATON_RETURN_IF_ERROR(ensure(attn_, size_t(tokens * q_width_) * kBf16));
    BATON_RETURN_IF_ERROR(ensure(gate_up_, size_t(tokens * 2 * ffn) * kBf16));
    BATON_RETURN_IF_ERROR(ensure(act_, size_t(tokens * ffn) * kBf16));
    BATON_RETURN_IF_ERROR(ensure(rows_, size_t(rows * hidden) * kBf16));
    BATON_RETURN_IF_ERROR(ensure(logits_, size_t(rows * vocab) * 4));
    BATON_RETURN_IF_ERROR(ensure(logits_host_, size_t(rows * vocab) * 4));
    const size_t ints = step_int_count(tokens, wanted);
    BATON_RETURN_IF_ERROR(ensure(step_ints_, ints * 4));
    return ensure(step_ints_host_, ints * 4);
  }

  // Token ids, positions and logit rows: one staged upload; then, for
  // layers without RoPE (SmolLM3's), a position 0 for every token, where
  // the rotation (cos 1, sin 0) leaves q and k as they are.
  size_t step_int_count(int64_t tokens, int64_t wanted) const {
    return size_t(2 * tokens + wanted + no_rope_positions(tokens));
  }
  int64_t no_rope_positions(int64_t tokens) const { return config_.no_rope.empty() ? 0 : tokens; }

  Status run_step(const StepBatch& batch, KvPool& kv, std::vector<float>* logits,
                  const LayerDoneCallback* on_layer_done) {
    const ModelConfig& c = config_;
    const int64_t tokens = batch.num_tokens;
    const auto wanted = int64_t(batch.logit_rows.size());
    const int64_t hidden = c.hidden_size, ffn = c.intermediate_size, vocab = c.vocab_size;
    int32_t last_position = 0;
    for (int64_t t = 0; t < tokens; ++t) {
      if (batch.positions[t] < 0)
        return invalid_argument("position " + std::to_string(batch.positions[t]) + " is negative");
      last_position = std::max(last_position, batch.positions[t]);
    }
    // engine.max_model_len may reach past max_position_embeddings, as on
    // the CPU backend, which forms every angle as it goes: the table grows.
    if (last_position >= rope_positions_)
      BATON_RETURN_IF_ERROR(upload_rope_table(int64_t(last_position) + 1));
    BATON_RETURN_IF_ERROR(size_step_buffers(tokens, wanted));

    const int64_t zeros = no_rope_positions(tokens);
    const size_t ints = step_int_count(tokens, wanted);
    auto* staged = static_cast<int32_t*>(step_ints_host_.data());
    std::copy_n(batch.token_ids, tokens, staged);
    std::copy_n(batch.positions, tokens, staged + tokens);
    for (int64_t i = 0; i < wanted; ++i) staged[2 * tokens + i] = int32_t(batch.logit_rows[i]);
    std::fill_n(staged + 2 * tokens + wanted, zeros, 0);
    auto* ids = static_cast<int32_t*>(step_ints_.data());
    const int32_t* positions = ids + tokens;
    const int32_t* logit_rows = ids + 2 * tokens;
    const int32_t* no_positions = logit_rows + wanted;
    BATON_RETURN_IF_ERROR(stream_.copy_to_device(ids, staged, ints * 4));

    kernels::PagedAttentionParams attention;
    attention.kv_pool = kv.data();
    attention.layout = kv.layout();
    attention.num_heads = c.num_heads;
    attention.num_seqs = batch.num_seqs;
    attention.query_start = batch.query_start;
    attention.context_lens = batch.context_lens;
    attention.block_tables = batch.block_tables;
    attention.block_table_stride = batch.block_table_stride;
    attention.scale = c.attention_scale();
    attention.qo_dtype = DType::kBF16;
    BATON_RETURN_IF_ERROR(ensure_attention(kv.layout().block_size));
    void* s = stream_.handle();
    BATON_RETURN_IF_ERROR(attention_->plan(attention, s));

    const float eps = c.rms_norm_eps;
    BATON_RETURN_IF_ERROR(
        kc::gather_rows_bf16(embed_tokens_.data(), hidden, ids, tokens, x_.data(), s));
    if (c.embedding_multiplier != 1.0f) {
      BATON_RETURN_IF_ERROR(kc::scale_bf16(x_.data(), tokens * hidden, c.embedding_multiplier, s));
    }
    BATON_RETURN_IF_ERROR(kc::rms_norm_bf16(x_.data(), layers_.front().input_norm.data(), tokens,
                                            hidden, eps, h_.data(), s));
    auto* qkv = static_cast<bf16_t*>(qkv_.data());
    for (int32_t layer = 0; layer < c.num_layers; ++layer) {
      const LayerOnDevice& w = layers_[size_t(layer)];
      BATON_RETURN_IF_ERROR(gemm(h_.data(), tokens, w.qkv, qkv_width_, hidden, qkv_.data(),
                                 w.qkv_bias.bytes() > 0 ? w.qkv_bias.data() : nullptr));
      if (c.qk_norm) {
        BATON_RETURN_IF_ERROR(kc::head_rms_norm_bf16(qkv, w.q_norm.data(), tokens, c.num_heads,
                                                     c.head_dim, qkv_width_, eps, s));
        BATON_RETURN_IF_ERROR(kc::head_rms_norm_bf16(qkv + q_width_, w.k_norm.data(), tokens,
                                                     c.num_kv_heads, c.head_dim, qkv_width_, eps,
                                                     s));
      }
      BATON_RETURN_IF_ERROR(
          kc::rope_bf16({.q = qkv,
                         .q_stride = qkv_width_,
                         .q_out = q_.data(),
                         .k = qkv + q_width_,
                         .k_stride = qkv_width_,
                         .positions = c.uses_rope(layer) ? positions : no_positions,
                         .cos_sin = static_cast<const float*>(rope_.data()),
                         .tokens = tokens,
                         .num_heads = c.num_heads,
                         .num_kv_heads = c.num_kv_heads,
                         .head_dim = c.head_dim},
                        s));
      BATON_RETURN_IF_ERROR(attention_->append_kv(kv.layout(), kv.data(), layer, qkv + q_width_,
                                                  qkv + q_width_ + kv_width_, qkv_width_, s));
      if (on_layer_done != nullptr) {
        // The transfer engine reads the layer as soon as it is told.
        BATON_RETURN_IF_ERROR(layer_done_.record(stream_));
        BATON_RETURN_IF_ERROR(layer_done_.synchronize());
        (*on_layer_done)(layer);
      }
      attention.q = q_.data();
      attention.out = attn_.data();
      attention.layer = layer;
      attention.window = c.window_of(layer);
      BATON_RETURN_IF_ERROR(attention_->run(attention, s));
      BATON_RETURN_IF_ERROR(gemm(attn_.data(), tokens, w.o, hidden, q_width_, h_.data(),
                                 w.o_bias.bytes() > 0 ? w.o_bias.data() : nullptr));
      BATON_RETURN_IF_ERROR(scale_for_residual(tokens));
      BATON_RETURN_IF_ERROR(kc::add_rms_norm_bf16(
          h_.data(), x_.data(), w.post_attention_norm.data(), tokens, hidden, eps, s));
      BATON_RETURN_IF_ERROR(gemm(h_.data(), tokens, w.gate_up, 2 * ffn, hidden, gate_up_.data()));
      BATON_RETURN_IF_ERROR(kc::silu_and_mul_bf16(gate_up_.data(), tokens, ffn, act_.data(), s));
      BATON_RETURN_IF_ERROR(gemm(act_.data(), tokens, w.down, hidden, ffn, h_.data()));
      // The residual add, then the next layer's input norm (the final norm
      // after the last layer): h = norm(x += h).
      const void* next_norm = layer + 1 < c.num_layers
                                  ? layers_[size_t(layer) + 1].input_norm.data()
                                  : final_norm_.data();
      BATON_RETURN_IF_ERROR(scale_for_residual(tokens));
      BATON_RETURN_IF_ERROR(
          kc::add_rms_norm_bf16(h_.data(), x_.data(), next_norm, tokens, hidden, eps, s));
    }

    logits->resize(size_t(wanted * vocab));
    if (wanted > 0) {
      BATON_RETURN_IF_ERROR(
          kc::gather_rows_bf16(h_.data(), hidden, logit_rows, wanted, rows_.data(), s));
      const kc::DeviceBuffer& head = tied_ ? embed_tokens_ : lm_head_;
      BATON_RETURN_IF_ERROR(gemm_->run({.x = rows_.data(),
                                        .w = head.data(),
                                        .out = logits_.data(),
                                        .m = wanted,
                                        .n = vocab,
                                        .k = hidden,
                                        .dtype = DType::kBF16,
                                        .out_dtype = DType::kF32,
                                        // Granite's logits scaling.
                                        .alpha = 1.0f / c.logits_scaling},
                                       s));
      BATON_RETURN_IF_ERROR(
          stream_.copy_to_host(logits_host_.data(), logits_.data(), size_t(wanted * vocab) * 4));
    }
    // The step's results are on the host, and its staged inputs free again.
    BATON_RETURN_IF_ERROR(stream_.synchronize());
    if (wanted > 0) {
      std::memcpy(logits->data(), logits_host_.data(), size_t(wanted * vocab) * 4);
    }
    return Status::ok();
  }

  // Granite's residual multiplier on a block's output in h_, before the
  // residual add (transformers rounds the BF16 product, then adds).
  Status scale_for_residual(int64_t tokens) {
    if (config_.residual_multiplier == 1.0f) return Status::ok();
    return kc::scale_bf16(h_.data(), tokens * config_.hidden_size, config_.residual_multiplier,
                          stream_.handle());
  }

  Status gemm(const void* x, int64_t m, const kc::DeviceBuffer& w, int64_t n, int64_t k, void* out,
              const void* bias = nullptr) {
    return gemm_->run({.x = x,
                       .w = w.data(),
                       .bias = bias,
                       .out = out,
                       .m = m,
                       .n = n,
                       .k = k,
                       .dtype = DType::kBF16,
                       .out_dtype = DType::kBF16},
                      stream_.handle());
  }

  // cos and sin of every position below `positions` (at least the model's
  // max_position_embeddings; past it, rounded up to a power of two) at
  // every θ_i the CPU backend uses (rope_inv_freq, with its scaling). The
  // angle is formed in F32 as transformers forms it; cos and sin are taken
  // in double. Called between steps: the stream is idle, so the old table
  // can go.
  Status upload_rope_table(int64_t positions) {
    const std::vector<float> inv_freq = rope_inv_freq(config_);
    const int32_t half = config_.head_dim / 2;
    const auto model = int64_t(std::max(config_.max_position_embeddings, 1));
    if (positions > model) positions = int64_t(std::bit_ceil(uint64_t(positions)));
    positions = std::min<int64_t>(std::max(positions, model), std::numeric_limits<int32_t>::max());
    std::vector<float> table(size_t(positions) * size_t(config_.head_dim));
    for (int32_t p = 0; p < int32_t(positions); ++p) {
      float* row = table.data() + size_t(p) * size_t(config_.head_dim);
      for (int32_t i = 0; i < half; ++i) {
        const double angle = double(float(p) * inv_freq[size_t(i)]);
        row[i] = float(std::cos(angle));
        row[half + i] = float(std::sin(angle));
      }
    }
    BATON_ASSIGN_OR_RETURN(kc::DeviceBuffer buffer,
                           kc::DeviceBuffer::allocate(table.size() * sizeof(float)));
    BATON_RETURN_IF_ERROR(buffer.copy_from_host(table.data(), table.size() * sizeof(float)));
    rope_ = std::move(buffer);
    rope_positions_ = int32_t(positions);
    return Status::ok();
  }

  int32_t index_;
  size_t weights_bytes_ = 0;  // on the device, once load() has uploaded them
  const ModelConfig& config_;
  int64_t q_width_ = 0, kv_width_ = 0, qkv_width_ = 0;
  kc::Stream stream_;
  kc::Event layer_done_;
  std::unique_ptr<kc::Gemm> gemm_;
  size_t gemm_workspace_bytes_ = size_t(32) << 20;  // cuBLASLt's, on the device
  std::unique_ptr<kc::PagedAttention> attention_;
  int32_t attention_shape_block_ = 0;

  kc::DeviceBuffer embed_tokens_, lm_head_, final_norm_, rope_;
  bool tied_ = false;
  int32_t rope_positions_ = 0;
  std::vector<LayerOnDevice> layers_;

  // Step scratch: activations [tokens, ...] BF16, the wanted rows, logits.
  kc::DeviceBuffer x_, h_, qkv_, q_, attn_, gate_up_, act_, rows_, logits_, step_ints_;
  kc::PinnedBuffer logits_host_, step_ints_host_;
};

// What FlashInfer's kernels and the BF16 vector paths need of the shape.
Status check_served(const ModelConfig& c) {
  if (c.head_dim != 64 && c.head_dim != 128) {
    return unimplemented("head_dim " + std::to_string(c.head_dim) +
                         ": the CUDA backend serves head_dim 64 and 128");
  }
  if (c.hidden_size % 8 != 0 || c.intermediate_size % 8 != 0) {
    return unimplemented("hidden_size and intermediate_size must be multiples of 8 on CUDA, got " +
                         std::to_string(c.hidden_size) + " and " +
                         std::to_string(c.intermediate_size));
  }
  return Status::ok();
}

}  // namespace

Result<std::unique_ptr<ForwardBackend>> make_cuda_forward(int32_t index,
                                                          const Checkpoint& checkpoint) {
  Status usable = kc::use_device(index);
  if (!usable.is_ok()) return usable.with_context("engine.device cuda:" + std::to_string(index));
  BATON_RETURN_IF_ERROR(check_served(checkpoint.config()));
  auto backend = std::make_unique<CudaForward>(index, checkpoint);
  BATON_RETURN_IF_ERROR(backend->load(checkpoint));
  return std::unique_ptr<ForwardBackend>(std::move(backend));
}

}  // namespace baton::engine
