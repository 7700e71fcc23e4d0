// libFuzzer target: an OpenAI request body as either front end hands it to
// validation. The first byte picks the route; the rest is the body. Each
// parse gives a request or a 400's message, never a crash or an exception.
#include <cstdint>
#include <string_view>

#include "router/completion_request.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace baton::router;
  if (size == 0) return 0;
  const std::string_view body(reinterpret_cast<const char*>(data) + 1, size - 1);
  switch (data[0] % 4) {
    case 0:
      (void)parse_completion_request(body);
      break;
    case 1:
      (void)parse_chat_request(body);
      break;
    case 2:
      (void)parse_tokenize_request(body);
      break;
    default:
      (void)parse_detokenize_request(body);
  }
  return 0;
}
