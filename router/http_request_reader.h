// router/http_request_reader.h — reading one HTTP/1.1 request off the wire:
// Beast's parser with the server's limits, and the handler's view of the
// parsed message. Shared by the connection and the HTTP fuzz target.
#pragma once

#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/string_body.hpp>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "router/http_server.h"

namespace baton::router {

inline constexpr uint32_t kMaxHeaderBytes = 64u << 10;  // request line + headers

using RequestParser = boost::beast::http::request_parser<boost::beast::http::string_body>;

// Bounds the request line and headers (kMaxHeaderBytes) and the body.
void limit_request_parser(RequestParser& parser, size_t max_body_bytes);

// The handler's view of a parsed message: header names lower-cased, and
// exactly one X-Request-Id, as vLLM reads it: the client's (its first) when
// it is a sane token (is_request_id_token), else a fresh one.
HttpRequest to_http_request(boost::beast::http::request<boost::beast::http::string_body>&& message);

// At most 128 visible ASCII characters: a value safe to echo in a header
// and to print in a log line.
bool is_request_id_token(std::string_view id);
std::string make_request_id();

}  // namespace baton::router
