#include "kernels/cuda/paged_attention.h"

#include <algorithm>
#include <exception>
#include <flashinfer/page.cuh>
#include <functional>
#include <string>
#include <vector>

#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/flashinfer_attention.cuh"
#include "kernels/cuda/stream.h"

namespace baton::kernels::cuda {
namespace {

using fi::Id;
using fi::T;

// FlashInfer's defaults for its scheduler's workspaces.
constexpr size_t kFloatWorkspaceBytes = size_t(128) << 20;
constexpr size_t kIntWorkspaceBytes = size_t(8) << 20;
static_assert(kFloatWorkspaceBytes + kIntWorkspaceBytes == kPagedAttentionWorkspaceBytes);

template <typename P>
P* at(void* base, int64_t offset) {
  return reinterpret_cast<P*>(static_cast<char*>(base) + offset);
}

// FlashInfer's launchers return errors and throw flashinfer::Error on shapes
// and workspaces they refuse; both become a Status naming the call.
template <typename F>
Status call_flashinfer(const char* what, F&& f) {
  try {
    cudaError_t e = f();
    if (e != cudaSuccess) return cuda_status(e, what, __FILE__, __LINE__);
    BATON_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    return Status::ok();
  } catch (const std::exception& e) {
    return internal_error(std::string(what) + ": " + e.what());
  }
}

class FlashInferAttention final : public PagedAttention {
 public:
  FlashInferAttention(const Shape& shape, DeviceBuffer float_ws, DeviceBuffer int_ws,
                      PinnedBuffer pinned_ws)
      : shape_(shape),
        float_ws_(std::move(float_ws)),
        int_ws_(std::move(int_ws)),
        pinned_ws_(std::move(pinned_ws)) {
    const auto& w = shape_.layer_windows;
    same_windows_ = std::adjacent_find(w.begin(), w.end(), std::not_equal_to<>()) == w.end();
    kv_window_ = kv_window(w);
  }

  bool planned_decode() const override { return decode_; }

  Status plan(const PagedAttentionParams& p, void* stream) override {
    Status planned = plan_step(p, stream);
    // A step that failed to plan runs nothing: append_kv and run return at once.
    if (!planned.is_ok()) num_tokens_ = 0;
    return planned;
  }

 private:
  Status plan_step(const PagedAttentionParams& p, void* stream) {
    auto s = static_cast<cudaStream_t>(stream);
    const int32_t bs = shape_.block_size;
    num_seqs_ = p.num_seqs;
    num_tokens_ = 0;
    decode_ = false;
    if (p.num_seqs <= 0) return Status::ok();  // append_kv and run then do nothing
    // Host arrays: page indptr, last page lengths, query indptr, per token
    // its sequence and position, then the pages themselves.
    page_indptr_.assign(1, 0);
    last_page_len_.clear();
    query_indptr_.assign(1, 0);
    token_seq_.clear();
    token_pos_.clear();
    pages_.clear();
    bool every_row_alone = true;
    for (int32_t q = 0; q < p.num_seqs; ++q) {
      const int32_t q_len = p.query_start[q + 1] - p.query_start[q];
      const int32_t ctx = p.context_lens[q];
      if (q_len <= 0 || ctx < q_len) {
        return invalid_argument("CUDA attention plan: sequence " + std::to_string(q) + " has " +
                                std::to_string(q_len) + " query rows and " + std::to_string(ctx) +
                                " tokens of context");
      }
      every_row_alone = every_row_alone && q_len == 1;
      const int32_t pages = (ctx + bs - 1) / bs;
      const int32_t* table = p.block_tables + int64_t(q) * p.block_table_stride;
      // A block id past the pool would be a write past it in append_kv:
      // checked here, where the table is on the host.
      if (pages > p.block_table_stride) {
        return invalid_argument("CUDA attention plan: sequence " + std::to_string(q) + " needs " +
                                std::to_string(pages) + " blocks, its table holds " +
                                std::to_string(p.block_table_stride));
      }
      // Blocks wholly behind the first row's widest window are read by no
      // layer (and may have been given back): the sequence starts after
      // them. Masks and the causal order are relative, so every position
      // moves back by the same amount.
      const int32_t skipped = kv_window_ > 0 ? std::max(0, ctx - q_len - kv_window_ + 1) / bs : 0;
      for (int32_t j = skipped; j < pages; ++j) {
        if (table[j] < 0 || table[j] >= p.layout.num_blocks) {
          return invalid_argument("CUDA attention plan: sequence " + std::to_string(q) +
                                  " has block " + std::to_string(table[j]) + " of a pool of " +
                                  std::to_string(p.layout.num_blocks));
        }
      }
      pages_.insert(pages_.end(), table + skipped, table + pages);
      page_indptr_.push_back(Id(pages_.size()));
      last_page_len_.push_back(ctx - (pages - 1) * bs);
      query_indptr_.push_back(query_indptr_.back() + q_len);
      for (int32_t j = 0; j < q_len; ++j) {
        token_seq_.push_back(q);
        token_pos_.push_back(ctx - q_len + j - skipped * bs);
      }
    }
    num_tokens_ = int64_t(token_seq_.size());
    const int group = shape_.num_heads / shape_.num_kv_heads;
    decode_ = every_row_alone && fi::decode_supports_group(group);

    // One upload of every array, staged in pinned memory.
    const size_t ints = page_indptr_.size() + last_page_len_.size() + query_indptr_.size() +
                        token_seq_.size() + token_pos_.size() + pages_.size();
    BATON_RETURN_IF_ERROR(reserve(ints * sizeof(Id), stream));
    Id* staged = static_cast<Id*>(step_pinned_.data());
    Id* device = static_cast<Id*>(step_device_.data());
    size_t offset = 0;
    auto place = [&](const std::vector<Id>& v) {
      std::copy(v.begin(), v.end(), staged + offset);
      Id* d = device + offset;
      offset += v.size();
      return d;
    };
    d_page_indptr_ = place(page_indptr_);
    d_last_page_len_ = place(last_page_len_);
    d_query_indptr_ = place(query_indptr_);
    d_token_seq_ = place(token_seq_);
    d_token_pos_ = place(token_pos_);
    d_pages_ = place(pages_);
    BATON_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(device, staged, ints * sizeof(Id), cudaMemcpyHostToDevice, s));

    // FlashInfer's scheduler stages its own arrays in pinned_ws_, copied on
    // `stream`; the previous step's copy has run (the caller's contract).
    if (decode_) {
      return call_flashinfer("flashinfer::DecodePlan", [&] {
        return fi::decode_plan(shape_.head_dim, group, float_ws_.data(), float_ws_.bytes(),
                               int_ws_.data(), pinned_ws_.data(), int_ws_.bytes(), decode_info_,
                               page_indptr_.data(), uint32_t(num_seqs_), uint32_t(shape_.num_heads),
                               uint32_t(bs), s);
      });
    }
    return call_flashinfer("flashinfer::PrefillPlan", [&] {
      return flashinfer::PrefillPlan<Id>(
          float_ws_.data(), float_ws_.bytes(), int_ws_.data(), pinned_ws_.data(), int_ws_.bytes(),
          prefill_info_, query_indptr_.data(), page_indptr_.data(), uint32_t(num_tokens_),
          uint32_t(num_seqs_), uint32_t(shape_.num_heads), uint32_t(shape_.num_kv_heads),
          uint32_t(shape_.head_dim), uint32_t(shape_.head_dim), uint32_t(bs),
          /*enable_cuda_graph=*/false, /*sizeof_dtype_o=*/sizeof(T),
          same_windows_ ? window_left(0) : -1, /*fixed_split_size=*/-1,
          /*disable_split_kv=*/!same_windows_, /*num_colocated_ctas=*/0,
          /*uniform_q_len=*/0, s, /*kv_dtype_bytes=*/sizeof(T));
    });
  }

 public:
  Status append_kv(const KvLayout& layout, void* pool, int32_t layer, const void* k, const void* v,
                   int64_t row_stride, void* stream) override {
    BATON_RETURN_IF_ERROR(check_layout(layout));
    if (num_tokens_ == 0) return Status::ok();
    auto kv = paged_kv(layout, pool, layer);
    const size_t d = size_t(layout.head_dim);
    return call_flashinfer("flashinfer::AppendPagedKVCache", [&] {
      return flashinfer::AppendPagedKVCache<T, Id>(
          kv, const_cast<T*>(static_cast<const T*>(k)), const_cast<T*>(static_cast<const T*>(v)),
          d_token_seq_, d_token_pos_, uint32_t(num_tokens_), size_t(row_stride), d,
          size_t(row_stride), d, static_cast<cudaStream_t>(stream));
    });
  }

  Status run(const PagedAttentionParams& p, void* stream) override {
    BATON_RETURN_IF_ERROR(check_layout(p.layout));
    if (p.qo_dtype != DType::kBF16) return invalid_argument("CUDA attention takes BF16 queries");
    if (p.window != window_of(p.layer)) {
      return invalid_argument("CUDA attention: layer " + std::to_string(p.layer) +
                              " is run with a window of " + std::to_string(p.window) +
                              ", its shape says " + std::to_string(window_of(p.layer)));
    }
    if (num_tokens_ == 0) return Status::ok();
    auto s = static_cast<cudaStream_t>(stream);
    auto kv = paged_kv(p.layout, const_cast<void*>(p.kv_pool), p.layer);
    auto* q = const_cast<T*>(static_cast<const T*>(p.q));
    auto* o = static_cast<T*>(p.out);
    const Id q_stride_n = shape_.num_heads * shape_.head_dim, q_stride_h = shape_.head_dim;
    if (decode_) {
      fi::DecodeParams params(q, /*q_rope_offset=*/nullptr, kv, o, /*lse=*/nullptr,
                              /*maybe_alibi_slopes=*/nullptr, uint32_t(shape_.num_heads),
                              q_stride_n, q_stride_h, window_left(p.layer),
                              /*logits_soft_cap=*/0.0f, p.scale, /*rope_scale=*/1.0f,
                              /*rope_theta=*/1e4f);
      const auto& info = decode_info_;
      void* ints = int_ws_.data();
      params.request_indices = at<Id>(ints, info.request_indices_offset);
      params.kv_tile_indices = at<Id>(ints, info.kv_tile_indices_offset);
      params.o_indptr = at<Id>(ints, info.o_indptr_offset);
      params.kv_chunk_size_ptr = at<Id>(ints, info.kv_chunk_size_ptr_offset);
      params.padded_batch_size = uint32_t(info.padded_batch_size);
      T* tmp_v = nullptr;
      float* tmp_s = nullptr;
      if (info.split_kv) {
        tmp_v = at<T>(float_ws_.data(), info.v_offset);
        tmp_s = at<float>(float_ws_.data(), info.s_offset);
        params.block_valid_mask = at<bool>(ints, info.block_valid_mask_offset);
      }
      return call_flashinfer("flashinfer::BatchDecodeWithPagedKVCacheDispatched", [&] {
        return fi::decode_run(shape_.head_dim, params, tmp_v, tmp_s, s);
      });
    }
    fi::PrefillParams params(q, kv, /*maybe_custom_mask=*/nullptr, d_query_indptr_,
                             /*maybe_mask_indptr=*/nullptr, /*maybe_q_rope_offset=*/nullptr, o,
                             /*lse=*/nullptr, /*maybe_alibi_slopes=*/nullptr,
                             uint32_t(shape_.num_heads), q_stride_n, q_stride_h,
                             window_left(p.layer), /*logits_soft_cap=*/0.0f, p.scale,
                             /*rope_scale=*/1.0f, /*rope_theta=*/1e4f);
    const auto& info = prefill_info_;
    void* ints = int_ws_.data();
    params.request_indices = at<Id>(ints, info.request_indices_offset);
    params.qo_tile_indices = at<Id>(ints, info.qo_tile_indices_offset);
    params.kv_tile_indices = at<Id>(ints, info.kv_tile_indices_offset);
    params.o_indptr = at<Id>(ints, info.o_indptr_offset);
    params.kv_chunk_size_ptr = at<Id>(ints, info.kv_chunk_size_ptr_offset);
    params.padded_batch_size = uint32_t(info.padded_batch_size);
    params.max_total_num_rows = uint32_t(info.total_num_rows);
    T* tmp_v = nullptr;
    float* tmp_s = nullptr;
    if (info.split_kv) {
      params.merge_indptr = at<Id>(ints, info.merge_indptr_offset);
      tmp_v = at<T>(float_ws_.data(), info.v_offset);
      tmp_s = at<float>(float_ws_.data(), info.s_offset);
    }
    const auto cta = uint32_t(info.cta_tile_q);
    return call_flashinfer("flashinfer::BatchPrefillWithPagedKVCacheDispatched", [&] {
      return shape_.head_dim == 64 ? fi::prefill_run_hd64(cta, params, tmp_v, tmp_s, s)
                                   : fi::prefill_run_hd128(cta, params, tmp_v, tmp_s, s);
    });
  }

 private:
  int32_t window_of(int32_t layer) const { return layer_window(shape_.layer_windows, layer); }
  // FlashInfer's form of a window: the keys a row sees before its own; -1 all.
  int32_t window_left(int32_t layer) const {
    return window_of(layer) > 0 ? window_of(layer) - 1 : -1;
  }

  Status check_layout(const KvLayout& layout) const {
    if (layout.key_order != KeyOrder::kTokenMajor || layout.dtype != DType::kBF16 ||
        layout.head_dim != shape_.head_dim || layout.num_kv_heads != shape_.num_kv_heads ||
        layout.block_size != shape_.block_size) {
      return invalid_argument("CUDA attention needs a BF16 token-major pool of its own shape");
    }
    return Status::ok();
  }

  // One layer of the pool as FlashInfer's HND pages: K of every block at
  // block strides from the layer's start, V one part further; the same
  // strides for both, which the decode kernel requires.
  flashinfer::paged_kv_t<T, Id> paged_kv(const KvLayout& layout, void* pool, int32_t layer) const {
    T* k = static_cast<T*>(pool) + layout.block_offset(layer, 0);
    T* v = k + layout.part_elements();
    const int64_t strides[4] = {int64_t(layout.block_elements()),
                                int64_t(layout.head_tile_elements()), int64_t(layout.head_dim), 1};
    return flashinfer::paged_kv_t<T, Id>(uint32_t(layout.num_kv_heads), uint32_t(layout.block_size),
                                         uint32_t(layout.head_dim), uint32_t(num_seqs_),
                                         flashinfer::QKVLayout::kHND, k, v, strides, d_pages_,
                                         d_page_indptr_, d_last_page_len_);
  }

  Status reserve(size_t bytes, void* stream) {
    if (step_device_.bytes() >= bytes) return Status::ok();
    // Growing frees buffers an earlier upload may still be reading.
    BATON_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)));
    const size_t grown = std::max(bytes, step_device_.bytes() * 2);
    // Both or neither: a pinned buffer smaller than the device one would be
    // overrun by the next plan.
    BATON_ASSIGN_OR_RETURN(DeviceBuffer device, DeviceBuffer::allocate(grown));
    BATON_ASSIGN_OR_RETURN(PinnedBuffer pinned, PinnedBuffer::allocate(grown));
    step_device_ = std::move(device);
    step_pinned_ = std::move(pinned);
    return Status::ok();
  }

  Shape shape_;
  // Whether every layer has the same window (or none): then the prefill
  // plan may split a long context's keys, since FlashInfer counts a
  // sequence's key chunks from the plan's window and the run's alike.
  bool same_windows_ = true;
  int32_t kv_window_ = 0;  // kv_window(shape_.layer_windows)
  DeviceBuffer float_ws_, int_ws_;
  PinnedBuffer pinned_ws_;
  DeviceBuffer step_device_;
  PinnedBuffer step_pinned_;

  bool decode_ = false;
  int32_t num_seqs_ = 0;
  int64_t num_tokens_ = 0;
  flashinfer::DecodePlanInfo decode_info_;
  flashinfer::PrefillPlanInfo prefill_info_;
  std::vector<Id> page_indptr_, last_page_len_, query_indptr_, token_seq_, token_pos_, pages_;
  Id *d_page_indptr_ = nullptr, *d_last_page_len_ = nullptr, *d_query_indptr_ = nullptr;
  Id *d_token_seq_ = nullptr, *d_token_pos_ = nullptr, *d_pages_ = nullptr;
};

}  // namespace

Result<std::unique_ptr<PagedAttention>> PagedAttention::create(const Shape& shape) {
  if (shape.head_dim != 64 && shape.head_dim != 128) {
    return invalid_argument("CUDA attention supports head_dim 64 and 128, not " +
                            std::to_string(shape.head_dim));
  }
  if (shape.num_kv_heads <= 0 || shape.num_heads % shape.num_kv_heads != 0 ||
      shape.block_size <= 0) {
    return invalid_argument("CUDA attention needs query heads a multiple of KV heads");
  }
  for (int32_t w : shape.layer_windows)
    if (w < 0) return invalid_argument("CUDA attention: a layer's window is negative");
  BATON_ASSIGN_OR_RETURN(DeviceBuffer float_ws, DeviceBuffer::allocate(kFloatWorkspaceBytes));
  BATON_ASSIGN_OR_RETURN(DeviceBuffer int_ws, DeviceBuffer::allocate(kIntWorkspaceBytes));
  BATON_ASSIGN_OR_RETURN(PinnedBuffer pinned_ws, PinnedBuffer::allocate(kIntWorkspaceBytes));
  return std::unique_ptr<PagedAttention>(
      new FlashInferAttention(shape, std::move(float_ws), std::move(int_ws), std::move(pinned_ws)));
}

}  // namespace baton::kernels::cuda
