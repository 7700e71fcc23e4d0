// router/zmq_request.h — one ZeroMQ front-end message read into a request
// (framing in router/zmq_frontend.h and docs/API.md). A pure function of
// the message's parts, shared by the front end and its fuzz target.
#pragma once

#include <cstddef>
#include <span>
#include <string>
#include <string_view>

#include "common/status.h"
#include "router/http_server.h"

namespace baton::router {

inline constexpr size_t kMaxZmqTagBytes = 256;

struct ZmqRequest {
  enum class Kind {
    kRequest,   // `request` holds the route's request
    kCancel,    // ends the client's request `tag`
    kTooLarge,  // the body is over the limit: answer 413
  };
  Kind kind = Kind::kRequest;
  std::string tag;
  HttpRequest request;  // method from the route, target = path, body, authorization
};

// `parts` are the message's frames after the routing identity: [tag, path,
// body] or [tag, path, body, api key]. InvalidArgument when their number or
// the tag's size is wrong (the message is dropped: there is no tag to
// answer under).
Result<ZmqRequest> read_zmq_request(std::span<const std::string_view> parts, size_t max_body_bytes);

}  // namespace baton::router
