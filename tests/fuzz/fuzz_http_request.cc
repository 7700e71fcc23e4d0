// libFuzzer target: bytes off an HTTP connection as the router reads them.
// Beast's parser with the server's limits; for a complete request, the
// handler's view of it (header names lower-cased, exactly one X-Request-Id
// that is a safe token), the API key check, and the JSON validation of its
// route's body. Nothing may crash, throw or break those invariants.
#include <boost/asio/buffer.hpp>
#include <boost/beast/http/error.hpp>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "router/api_keys.h"
#include "router/http_request_reader.h"
#include "tests/fuzz/route_body.h"

namespace {

using namespace baton::router;
namespace http = boost::beast::http;

constexpr size_t kMaxBodyBytes = 64u << 10;

void check_view(const HttpRequest& request) {
  int request_ids = 0;
  for (const auto& [name, value] : request.headers) {
    for (char c : name) {
      if (c >= 'A' && c <= 'Z') std::abort();  // names are lower-cased
    }
    if (name == "x-request-id") {
      ++request_ids;
      if (!is_request_id_token(value)) std::abort();
    }
  }
  if (request_ids != 1) std::abort();
  if (request.body.size() > kMaxBodyBytes) std::abort();
}

void route(const HttpRequest& request) {
  static const ApiKeys keys({"sk-fuzz"});
  const std::string path = request.target.substr(0, request.target.find('?'));
  const bool admitted = keys.admits(path, request.header("authorization"));
  if (!admitted && !path.starts_with("/v1/")) std::abort();  // only /v1/ routes are keyed
  if (request.method == "POST") baton::fuzz::validate_for_route(path, request.body);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  RequestParser parser;
  limit_request_parser(parser, kMaxBodyBytes);
  parser.eager(true);
  size_t used = 0;
  while (!parser.is_done()) {
    boost::beast::error_code ec;
    const size_t n = parser.put(boost::asio::buffer(data + used, size - used), ec);
    used += n;
    if (ec == http::error::need_more && n > 0) continue;
    if (ec) return 0;  // malformed, over a limit, or cut short: the server answers 400/413
    if (n == 0) return 0;
  }
  HttpRequest request = to_http_request(parser.release());
  check_view(request);
  route(request);
  return 0;
}
