// libFuzzer target: a control-plane frame as a node or the router receives
// it. Decoding gives a message or an error; a decoded message encodes and
// decodes to the same bytes again, and the answer to a refused frame is
// itself a message that decodes.
#include <cstdint>
#include <cstdlib>
#include <span>

#include "common/control_messages.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace baton::control;
  auto message = decode(std::span<const uint8_t>(data, size));
  if (!message.is_ok()) {
    const Rejected rejected = rejection_of(std::span<const uint8_t>(data, size), message.status());
    if (!decode(encode(rejected)).is_ok()) std::abort();
    return 0;
  }
  const std::vector<uint8_t> bytes = encode(*message);
  auto again = decode(bytes);
  if (!again.is_ok() || encode(*again) != bytes) std::abort();
  return 0;
}
