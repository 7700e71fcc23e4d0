// libFuzzer target: a ZeroMQ front-end message as the router reads it. The
// input is the message's frames after the routing identity, separated by
// 0x1f bytes. Reading gives a request, a cancel, a 413 or a refusal; a
// request is shaped as the routes expect (POST exactly for the routes that
// take a body, the body and the key as sent) and its body goes to its
// route's validation.
#include <cstdint>
#include <cstdlib>
#include <string_view>
#include <vector>

#include "router/zmq_request.h"
#include "tests/fuzz/route_body.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace baton::router;
  constexpr size_t kMaxBodyBytes = 64u << 10;
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  std::vector<std::string_view> parts;
  for (size_t start = 0;;) {
    const size_t end = input.find('\x1f', start);
    parts.push_back(input.substr(start, end == std::string_view::npos ? end : end - start));
    if (end == std::string_view::npos) break;
    start = end + 1;
  }
  auto read = read_zmq_request(parts, kMaxBodyBytes);
  if (!read.is_ok()) return 0;
  if (read->tag != parts[0] || read->tag.size() > kMaxZmqTagBytes) std::abort();
  if (read->kind != ZmqRequest::Kind::kRequest) return 0;
  const HttpRequest& request = read->request;
  if (request.target != parts[1] || request.body != parts[2]) std::abort();
  const bool post = request.method == "POST";
  const bool body_route = parts[1] == "/v1/completions" || parts[1] == "/v1/chat/completions" ||
                          parts[1] == "/tokenize" || parts[1] == "/detokenize";
  if (post != body_route) std::abort();
  if ((parts.size() == 4) != !request.header("authorization").empty()) std::abort();
  if (post) baton::fuzz::validate_for_route(request.target, request.body);
  return 0;
}
