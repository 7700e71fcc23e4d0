// common/kv_layout.h — the one paged-KV layout of Baton.
//
// A KV pool is a single allocation holding K and V of every layer for
// `num_blocks` blocks of `block_size` tokens each:
//
//   pool[num_layers][num_blocks][2 (K, V)][num_kv_heads][tile]
//
// where one KV head's tile of one block is
//
//   K: [head_dim / g][block_size][g]   (g = key_group_of(dtype): 2 for BF16 and
//                                        fp8_e4m3, 4 for int8, else 1)
//   V: [block_size][head_dim]
//
// The 8-bit formats (int8, fp8_e4m3) store codes; a block of them ends with
// the float scales of its rows, one per token and KV head for K and for V:
//
//   block = [K tiles][V tiles][scales: 2 (K, V)][num_kv_heads][block_size] float
//
// so a block is self-describing: whatever moves or stores its bytes (the
// transfer, the SSD tier, the prefix cache) moves its scales with it. A
// scale per token and head, rather than per block, lets a token's row be
// quantized once when it is written, never again as the block fills.
//
// That is the CPU backend's key order (KeyOrder::kGrouped). GPU attention
// kernels (FlashInfer's paged layout "HND") read keys as whole rows like V:
// KeyOrder::kTokenMajor, which is the same formula with g = head_dim, so
// every offset below serves both and block byte ranges do not change.
//
// Why this order (docs/design/kv-layout.md has the full argument):
//  * Layer-major: one layer's pages for all blocks form one contiguous region,
//    so a run of adjacent block ids is one contiguous byte range per layer.
//    Layer-wise transfer posts one put per (layer, run of adjacent blocks).
//  * K and V of a block sit side by side: one put moves both.
//  * Within a block, each KV head's tile is contiguous, so decode attention
//    streams one head's keys and values while applying them to every query
//    head of its GQA group.
//  * K keeps the keys of a block side by side, one dimension of each at a
//    time (a pair for BF16): a vector load takes the same dimensions of
//    several keys, so scores accumulate with keys across the lanes and need
//    no horizontal sums. BF16 pairs widen to F32 with a shift and a mask and
//    are what AVX-512's BF16 dot product takes; F16 widens from 8 packed
//    values. V keeps each token's row, which the weighted sum over keys
//    takes whole.
//
// The offsets are plain inline arithmetic usable from CUDA kernels, the
// transfer engine and SSD offload alike. A block id is just an index; the pool
// that owns the memory is the one this layout describes.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/dtype.h"
#include "common/host_device.h"

namespace baton {

enum class KvPart : uint8_t { kKey = 0, kValue = 1 };

// How a K tile orders its elements: grouped by dimension (the CPU kernels'
// order) or one whole key row after another (the GPU kernels' order).
enum class KeyOrder : uint8_t { kGrouped = 0, kTokenMajor = 1 };

// Elements of one key that lie side by side in a grouped K tile of dtype t:
// a BF16 pair (what VDPBF16PS takes; E4M3 pairs become BF16 ones), four
// int8 codes (what VPDPBUSD takes), else one.
BATON_HOST_DEVICE constexpr int32_t key_group_of(DType t) {
  return t == DType::kBF16 || t == DType::kFP8E4M3 ? 2 : t == DType::kI8 ? 4 : 1;
}

struct KvLayout {
  int32_t num_layers = 0;
  int32_t num_blocks = 0;
  int32_t block_size = 16;  // tokens per block
  int32_t num_kv_heads = 0;
  int32_t head_dim = 0;
  DType dtype = DType::kF32;
  KeyOrder key_order = KeyOrder::kGrouped;

  BATON_HOST_DEVICE size_t element_bytes() const { return dtype_size(dtype); }
  // Elements of one head's K (or V) tile in one block: block_size x head_dim.
  BATON_HOST_DEVICE size_t head_tile_elements() const {
    return size_t(block_size) * size_t(head_dim);
  }
  // Elements of K (or V) of one block of one layer.
  BATON_HOST_DEVICE size_t part_elements() const {
    return size_t(num_kv_heads) * head_tile_elements();
  }
  // Bytes (= elements: quantized formats are 8-bit) of a block's scales; 0
  // for the unquantized formats.
  BATON_HOST_DEVICE size_t scale_bytes() const {
    return is_quantized(dtype) ? 2 * size_t(num_kv_heads) * size_t(block_size) * sizeof(float) : 0;
  }
  // Elements of K and V (and their scales) of one block of one layer.
  BATON_HOST_DEVICE size_t block_elements() const { return 2 * part_elements() + scale_bytes(); }
  BATON_HOST_DEVICE size_t block_bytes() const { return block_elements() * element_bytes(); }
  // Elements of one layer across all blocks.
  BATON_HOST_DEVICE size_t layer_elements() const { return size_t(num_blocks) * block_elements(); }
  BATON_HOST_DEVICE size_t total_elements() const { return size_t(num_layers) * layer_elements(); }
  BATON_HOST_DEVICE size_t total_bytes() const { return total_elements() * element_bytes(); }
  // K and V bytes (scales included) one token occupies across all layers.
  BATON_HOST_DEVICE size_t bytes_per_token() const {
    return size_t(num_layers) * block_bytes() / size_t(block_size);
  }

  // Element offset of the start of (layer, block): K then V follow.
  BATON_HOST_DEVICE size_t block_offset(int32_t layer, int32_t block) const {
    return size_t(layer) * layer_elements() + size_t(block) * block_elements();
  }
  BATON_HOST_DEVICE size_t block_byte_offset(int32_t layer, int32_t block) const {
    return block_offset(layer, block) * element_bytes();
  }
  // Element offset of the head tile of (layer, block, part, head).
  BATON_HOST_DEVICE size_t head_tile_offset(int32_t layer, int32_t block, KvPart part,
                                            int32_t kv_head) const {
    return block_offset(layer, block) + size_t(part) * part_elements() +
           size_t(kv_head) * head_tile_elements();
  }
  // Elements of a key that lie side by side in a K tile: key_group_of(dtype)
  // when grouped (head_dim must be a multiple of it; RoPE makes head_dim
  // even), the whole key when token-major.
  BATON_HOST_DEVICE int32_t key_group() const {
    return key_order == KeyOrder::kTokenMajor ? head_dim : key_group_of(dtype);
  }
  // Elements between dimension groups g and g + 1 of one key in a K tile.
  BATON_HOST_DEVICE size_t key_group_stride() const { return size_t(block_size) * key_group(); }
  // Offset of dimension `dim` of a key from that key's first element, with
  // `group` elements of it side by side and `group_stride` between groups
  // (a kernel that knows the group at compile time passes it).
  BATON_HOST_DEVICE static constexpr size_t key_dim_offset(int32_t dim, int32_t group,
                                                           size_t group_stride) {
    return size_t(dim / group) * group_stride + size_t(dim % group);
  }
  BATON_HOST_DEVICE size_t key_dim_offset(int32_t dim) const {
    return key_dim_offset(dim, key_group(), key_group_stride());
  }
  // Element offset of dimension `dim` of the key in `slot`.
  BATON_HOST_DEVICE size_t key_offset(int32_t layer, int32_t block, int32_t kv_head, int32_t slot,
                                      int32_t dim) const {
    return head_tile_offset(layer, block, KvPart::kKey, kv_head) +
           size_t(slot) * size_t(key_group()) + key_dim_offset(dim);
  }
  // Byte offset of the float scale of the K (or V) row of (kv_head, slot)
  // of a quantized layout. Rows of a head are adjacent: a block's scales of
  // one head are one run of block_size floats. It may be unaligned (read and
  // write it with memcpy).
  BATON_HOST_DEVICE size_t scale_byte_offset(int32_t layer, int32_t block, KvPart part,
                                             int32_t kv_head, int32_t slot) const {
    return block_byte_offset(layer, block) + 2 * part_elements() +
           (size_t(part) * size_t(num_kv_heads) + size_t(kv_head)) * size_t(block_size) *
               sizeof(float) +
           size_t(slot) * sizeof(float);
  }
  // Element offset of the head_dim vector of the value in `slot`.
  BATON_HOST_DEVICE size_t value_offset(int32_t layer, int32_t block, int32_t kv_head,
                                        int32_t slot) const {
    return head_tile_offset(layer, block, KvPart::kValue, kv_head) +
           size_t(slot) * size_t(head_dim);
  }

  BATON_HOST_DEVICE bool same_geometry(const KvLayout& o) const {
    return num_layers == o.num_layers && block_size == o.block_size &&
           num_kv_heads == o.num_kv_heads && head_dim == o.head_dim && dtype == o.dtype &&
           key_order == o.key_order;
  }
};

}  // namespace baton
