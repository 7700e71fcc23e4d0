#include "router/zmq_request.h"

namespace baton::router {

Result<ZmqRequest> read_zmq_request(std::span<const std::string_view> parts,
                                    size_t max_body_bytes) {
  if (parts.size() != 3 && parts.size() != 4) {
    return invalid_argument("a message of " + std::to_string(parts.size()) +
                            " parts (want [tag, path, body, api key?])");
  }
  if (parts[0].size() > kMaxZmqTagBytes) {
    return invalid_argument("a tag of " + std::to_string(parts[0].size()) + " bytes, over " +
                            std::to_string(kMaxZmqTagBytes));
  }
  ZmqRequest out;
  out.tag = std::string(parts[0]);
  const std::string_view path = parts[1];
  if (path == "cancel") {
    out.kind = ZmqRequest::Kind::kCancel;
    return out;
  }
  if (parts[2].size() > max_body_bytes) {
    out.kind = ZmqRequest::Kind::kTooLarge;
    return out;
  }
  const bool takes_body = path == "/v1/completions" || path == "/v1/chat/completions" ||
                          path == "/tokenize" || path == "/detokenize";
  out.request.method = takes_body ? "POST" : "GET";
  out.request.target = std::string(path);
  out.request.body = std::string(parts[2]);
  if (parts.size() == 4) {
    out.request.headers.emplace_back("authorization", "Bearer " + std::string(parts[3]));
  }
  return out;
}

}  // namespace baton::router
