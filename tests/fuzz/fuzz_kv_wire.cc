// libFuzzer target: the KV transfer's wire format as a peer sends it (pool
// descriptors, completion notices, data headers). The first byte picks the
// decoder; a decoded value encodes and decodes to the same bytes again.
#include <cstdint>
#include <cstdlib>
#include <span>

#include "kv_transfer/wire.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace baton::kv_transfer;
  if (size == 0) return 0;
  const std::span<const uint8_t> bytes(data + 1, size - 1);
  switch (data[0] % 3) {
    case 0:
      if (auto d = decode_descriptor(bytes); d.is_ok()) {
        const auto again = encode_descriptor(*d);
        auto twice = decode_descriptor(again);
        if (!twice.is_ok() || encode_descriptor(*twice) != again) std::abort();
      }
      break;
    case 1:
      if (auto n = decode_notice(bytes); n.is_ok()) {
        const auto again = encode_notice(*n);
        auto twice = decode_notice(again);
        if (!twice.is_ok() || encode_notice(*twice) != again) std::abort();
      }
      break;
    default:
      if (auto h = decode_data_header(bytes); h.is_ok()) {
        const auto again = encode_data_header(*h);
        auto twice = decode_data_header(again);
        if (!twice.is_ok() || encode_data_header(*twice) != again) std::abort();
      }
  }
  return 0;
}
