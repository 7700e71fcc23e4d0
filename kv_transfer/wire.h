// kv_transfer/wire.h — the bytes the transfer engines exchange, and their codecs.
//
// Three message kinds, each opening with a 4-byte magic, a version and a kind,
// little-endian, fixed-width fields, length-checked on decode:
//  * PoolDescriptor: what a peer needs to write into this node's pool — UCX
//    worker address, pool base address and size, packed rkey, KvLayout
//    geometry. The control plane carries it (a small bootstrap message).
//  * Notice: sender -> receiver "transfer T of request R is complete" with the
//    layer range, bytes, operations and xxhash64 of the bytes written; and
//    receiver -> sender acknowledgement carrying the receiver's verdict. The
//    same layout carries the put grants (RMA only: a receiver cannot stop
//    one-sided writes itself, so it lets them happen layer range by layer
//    range): kPutAsk "may I put layers [b, e) of T?", kPutGrant (status kOk:
//    go; anything else: stop), and kPutsStopped "T failed or was cancelled,
//    and every put of it has reached you" (sent after a flush). kLayerLanded
//    "layer L of T is in your pool" lets a verifying receiver hash each layer
//    as it lands when the sender copies into a mapped pool, or puts into a
//    staged pool's slots (sent once a flush saw the layer's puts land); kLayerHash
//    "layer L of T hashes to H" lets a receiver whose pool is staged verify
//    each layer, and copy it in, as soon as the layer has landed. Both carry
//    the sender's hash of the layer (BlockHashes::layer_digest) in checksum.
//  * DataHeader: the active-message header of one merged run (AM mode): which
//    transfer, which layer, which destination blocks.
// Decoding never trusts a length: a garbage or truncated buffer is a kDataLoss
// Status naming the message, never a crash.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "common/kv_layout.h"
#include "common/status.h"

namespace baton::kv_transfer {

inline constexpr uint32_t kWireMagic = 0x4b564254;  // "TBVK" little-endian: Baton KV
// 2: put grants; 3: K tiles with keys side by side (common/kv_layout.h), so
// a peer of an earlier version would read the blocks' K as something else;
// 4: the 8-bit formats (their rows' scales inside the block), int8 K tiles
// with four dimensions of a key side by side; 5: E4M3 K tiles with pairs of
// dimensions side by side; 6: the descriptor's flags, and the layers'
// hashes (kLayerHash, and kLayerLanded's checksum).
inline constexpr uint16_t kWireVersion = 6;

enum class WireKind : uint16_t {
  kDescriptor = 1,
  kNotice = 2,
  kAck = 3,
  kData = 4,
  kPutAsk = 5,
  kPutGrant = 6,
  kPutsStopped = 7,
  kLayerLanded = 8,
  kLayerHash = 9,
};

// Upper bounds that keep a hostile length from becoming a huge allocation.
inline constexpr uint32_t kMaxWorkerAddressBytes = 64 * 1024;
inline constexpr uint32_t kMaxRkeyBytes = 64 * 1024;

struct PoolDescriptor {
  std::vector<uint8_t> worker_address;
  uint64_t pool_base = 0;   // remote virtual address of pool byte 0
  uint64_t pool_bytes = 0;  // must equal layout.total_bytes()
  std::vector<uint8_t> rkey;
  KvLayout layout;
  uint32_t flags = 0;  // kPoolFlag* bits
};

// Descriptor flag: the pool is staged (a device's, through host slots):
// its receiver copies each verified layer in as it lands, given the layers'
// hashes (kLayerHash).
inline constexpr uint32_t kPoolFlagStaged = 1;

std::vector<uint8_t> encode_descriptor(const PoolDescriptor& d);
Result<PoolDescriptor> decode_descriptor(std::span<const uint8_t> bytes);

// The completion notice (kNotice), the receiver's reply (kAck) and the put
// grants (kPutAsk, kPutGrant, kPutsStopped), and the layer messages
// (kLayerLanded, kLayerHash).
struct Notice {
  WireKind kind = WireKind::kNotice;
  uint64_t request_id = 0;
  uint64_t transfer_id = 0;
  int32_t layer_begin = 0;
  int32_t layer_end = 0;
  uint32_t num_blocks = 0;
  uint32_t ops = 0;          // merged operations the sender posted
  uint64_t bytes = 0;        // bytes written
  uint64_t checksum = 0;     // XXH3-64 of the bytes, in layer then block-pair order
  uint32_t status_code = 0;  // kAck, kPutGrant: StatusCode of the receiver's verdict
  uint32_t flags = 0;        // kNotice only: kNoticeFlag* bits
};

// Notice flag: the bytes came as active messages (the receiver counted them).
inline constexpr uint32_t kNoticeFlagAmData = 1;
// Notice flag: the sender computed no checksum (verify_checksum off).
inline constexpr uint32_t kNoticeFlagNoChecksum = 2;
// Notice flag: the bytes came as tagged messages (kNoticeFlagAmData is set too:
// the receiver counted and hashed them as they landed).
inline constexpr uint32_t kNoticeFlagTagData = 4;

// Active message ids.
inline constexpr uint32_t kAmControl = 11;  // notices, acks (and whatever garbage arrives)
inline constexpr uint32_t kAmData = 12;     // one merged run of KV bytes

// Transfer ids travel in 32 bits of a tag; layers in 8, blocks in 24.
inline constexpr uint64_t kMaxTransferId = 0xffffffffull;
inline constexpr int32_t kMaxLayers = 256;
inline constexpr int32_t kMaxBlocks = 1 << 24;

// Tag of one tagged run: transfer id (32 bits), layer (8), first destination block (24).
inline constexpr int kTagLayerBits = 8;
inline constexpr int kTagBlockBits = 24;
inline constexpr uint64_t make_data_tag(uint64_t transfer_id, int32_t layer, int32_t block) {
  return (transfer_id << 32) | (uint64_t(uint32_t(layer)) << kTagBlockBits) |
         uint64_t(uint32_t(block));
}

std::vector<uint8_t> encode_notice(const Notice& n);
Result<Notice> decode_notice(std::span<const uint8_t> bytes);

struct DataHeader {
  uint64_t transfer_id = 0;
  int32_t layer = 0;
  int32_t dst_block = 0;    // first destination block of the run
  int32_t block_count = 0;  // adjacent destination blocks in the run
};

inline constexpr size_t kDataHeaderBytes = 4 + 2 + 2 + 8 + 4 + 4 + 4;
std::vector<uint8_t> encode_data_header(const DataHeader& h);
Result<DataHeader> decode_data_header(std::span<const uint8_t> bytes);

}  // namespace baton::kv_transfer
