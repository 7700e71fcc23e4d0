#include "kv_transfer/wire.h"

#include <cstring>
#include <string>

namespace baton::kv_transfer {
namespace {

class Writer {
 public:
  template <typename T>
  void put(T v) {
    static_assert(std::is_integral_v<T>);
    for (size_t i = 0; i < sizeof(T); ++i) out_.push_back(uint8_t(uint64_t(v) >> (8 * i)));
  }
  void put_bytes(std::span<const uint8_t> b) {
    put(uint32_t(b.size()));
    out_.insert(out_.end(), b.begin(), b.end());
  }
  void header(WireKind kind) {
    put(kWireMagic);
    put(kWireVersion);
    put(uint16_t(kind));
  }
  std::vector<uint8_t> take() { return std::move(out_); }

 private:
  std::vector<uint8_t> out_;
};

class Reader {
 public:
  Reader(std::span<const uint8_t> in, const char* what) : in_(in), what_(what) {}

  template <typename T>
  bool get(T& v) {
    if (in_.size() - pos_ < sizeof(T)) return fail("truncated");
    uint64_t x = 0;
    for (size_t i = 0; i < sizeof(T); ++i) x |= uint64_t(in_[pos_ + i]) << (8 * i);
    v = T(x);
    pos_ += sizeof(T);
    return true;
  }
  bool get_bytes(std::vector<uint8_t>& b, uint32_t max) {
    uint32_t n = 0;
    if (!get(n)) return false;
    if (n > max) return fail("field length " + std::to_string(n) + " over limit");
    if (in_.size() - pos_ < n) return fail("truncated");
    b.assign(in_.begin() + pos_, in_.begin() + pos_ + n);
    pos_ += n;
    return true;
  }
  bool header(WireKind expected) {
    uint32_t magic = 0;
    uint16_t version = 0, kind = 0;
    if (!get(magic) || !get(version) || !get(kind)) return false;
    if (magic != kWireMagic) return fail("bad magic");
    if (version != kWireVersion) return fail("unsupported version " + std::to_string(version));
    if (kind != uint16_t(expected)) return fail("wrong kind " + std::to_string(kind));
    return true;
  }
  bool finish() {
    if (pos_ != in_.size()) return fail(std::to_string(in_.size() - pos_) + " trailing bytes");
    return true;
  }
  bool fail(const std::string& why) {
    if (error_.empty()) error_ = std::string(what_) + ": " + why;
    return false;
  }
  Status error() const { return data_loss(error_); }

 private:
  std::span<const uint8_t> in_;
  size_t pos_ = 0;
  const char* what_;
  std::string error_;
};

// Within what the wire can name too: a block past kMaxBlocks or a layer
// past kMaxLayers would alias another in the data tags.
bool valid_layout(const KvLayout& l) {
  return l.num_layers > 0 && l.num_layers <= kMaxLayers && l.num_blocks > 0 &&
         l.num_blocks <= kMaxBlocks && l.block_size > 0 && l.num_kv_heads > 0 && l.head_dim > 0 &&
         uint8_t(l.dtype) <= uint8_t(kLastDType) &&
         uint8_t(l.key_order) <= uint8_t(KeyOrder::kTokenMajor);
}

}  // namespace

std::vector<uint8_t> encode_descriptor(const PoolDescriptor& d) {
  Writer w;
  w.header(WireKind::kDescriptor);
  w.put_bytes(d.worker_address);
  w.put(d.pool_base);
  w.put(d.pool_bytes);
  w.put_bytes(d.rkey);
  w.put(d.layout.num_layers);
  w.put(d.layout.num_blocks);
  w.put(d.layout.block_size);
  w.put(d.layout.num_kv_heads);
  w.put(d.layout.head_dim);
  w.put(uint8_t(d.layout.dtype));
  w.put(uint8_t(d.layout.key_order));
  w.put(d.flags);
  return w.take();
}

Result<PoolDescriptor> decode_descriptor(std::span<const uint8_t> bytes) {
  Reader r(bytes, "pool descriptor");
  PoolDescriptor d;
  uint8_t dtype = 0, key_order = 0;
  if (!r.header(WireKind::kDescriptor) || !r.get_bytes(d.worker_address, kMaxWorkerAddressBytes) ||
      !r.get(d.pool_base) || !r.get(d.pool_bytes) || !r.get_bytes(d.rkey, kMaxRkeyBytes) ||
      !r.get(d.layout.num_layers) || !r.get(d.layout.num_blocks) || !r.get(d.layout.block_size) ||
      !r.get(d.layout.num_kv_heads) || !r.get(d.layout.head_dim) || !r.get(dtype) ||
      !r.get(key_order) || !r.get(d.flags) || !r.finish()) {
    return r.error();
  }
  d.layout.dtype = DType(dtype);
  d.layout.key_order = KeyOrder(key_order);
  if (!valid_layout(d.layout)) return data_loss("pool descriptor: invalid KV layout");
  if (d.worker_address.empty()) return data_loss("pool descriptor: empty worker address");
  if (d.rkey.empty()) return data_loss("pool descriptor: empty rkey");
  if (d.pool_bytes != d.layout.total_bytes()) {
    return data_loss("pool descriptor: pool size does not match its layout");
  }
  return d;
}

std::vector<uint8_t> encode_notice(const Notice& n) {
  Writer w;
  w.header(n.kind);
  w.put(n.request_id);
  w.put(n.transfer_id);
  w.put(n.layer_begin);
  w.put(n.layer_end);
  w.put(n.num_blocks);
  w.put(n.ops);
  w.put(n.bytes);
  w.put(n.checksum);
  w.put(n.status_code);
  w.put(n.flags);
  return w.take();
}

namespace {

const char* notice_name(WireKind kind) {
  switch (kind) {
    case WireKind::kAck:
      return "transfer ack";
    case WireKind::kPutAsk:
      return "put request";
    case WireKind::kPutGrant:
      return "put grant";
    case WireKind::kPutsStopped:
      return "puts stopped";
    case WireKind::kLayerLanded:
      return "layer landed";
    case WireKind::kLayerHash:
      return "layer hash";
    default:
      return "transfer notice";
  }
}

}  // namespace

Result<Notice> decode_notice(std::span<const uint8_t> bytes) {
  // Peek the kind: notices, acks and put grants share one layout.
  Notice n;
  if (bytes.size() >= 8) {
    uint16_t kind = uint16_t(bytes[6] | (bytes[7] << 8));
    for (WireKind k : {WireKind::kAck, WireKind::kPutAsk, WireKind::kPutGrant,
                       WireKind::kPutsStopped, WireKind::kLayerLanded, WireKind::kLayerHash}) {
      if (kind == uint16_t(k)) n.kind = k;
    }
  }
  Reader r(bytes, notice_name(n.kind));
  if (!r.header(n.kind) || !r.get(n.request_id) || !r.get(n.transfer_id) || !r.get(n.layer_begin) ||
      !r.get(n.layer_end) || !r.get(n.num_blocks) || !r.get(n.ops) || !r.get(n.bytes) ||
      !r.get(n.checksum) || !r.get(n.status_code) || !r.get(n.flags) || !r.finish()) {
    return r.error();
  }
  if (n.layer_begin < 0 || n.layer_end <= n.layer_begin) {
    return data_loss("transfer notice: empty or negative layer range");
  }
  if (n.status_code > uint32_t(StatusCode::kInternal)) {
    return data_loss("transfer ack: unknown status code");
  }
  return n;
}

std::vector<uint8_t> encode_data_header(const DataHeader& h) {
  Writer w;
  w.header(WireKind::kData);
  w.put(h.transfer_id);
  w.put(h.layer);
  w.put(h.dst_block);
  w.put(h.block_count);
  return w.take();
}

Result<DataHeader> decode_data_header(std::span<const uint8_t> bytes) {
  Reader r(bytes, "transfer data header");
  DataHeader h;
  if (!r.header(WireKind::kData) || !r.get(h.transfer_id) || !r.get(h.layer) ||
      !r.get(h.dst_block) || !r.get(h.block_count) || !r.finish()) {
    return r.error();
  }
  if (h.layer < 0 || h.dst_block < 0 || h.block_count <= 0) {
    return data_loss("transfer data header: negative layer or block range");
  }
  return h;
}

}  // namespace baton::kv_transfer
