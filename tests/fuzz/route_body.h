// tests/fuzz/route_body.h — hands a request body to the validation of its
// route, as OpenAiService does, for the front ends' fuzz targets.
#pragma once

#include <string>

#include "router/completion_request.h"

namespace baton::fuzz {

inline void validate_for_route(const std::string& path, const std::string& body) {
  using namespace baton::router;
  if (path == "/v1/completions") (void)parse_completion_request(body);
  if (path == "/v1/chat/completions") (void)parse_chat_request(body);
  if (path == "/tokenize") (void)parse_tokenize_request(body);
  if (path == "/detokenize") (void)parse_detokenize_request(body);
}

}  // namespace baton::fuzz
