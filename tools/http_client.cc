// tools/http_client.cc — a blocking HTTP client with a deadline: Beast's
// asynchronous operations run to completion on a private io_context, since
// a tcp_stream's expiry bounds only those (its synchronous connect, write
// and read wait as long as the peer keeps them: a connect to a silent host
// waited the kernel's two minutes of SYN retries).
#include "tools/http_client.h"

#include <boost/asio/connect.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <limits>

namespace baton::tools {

namespace beast = boost::beast;
namespace http = beast::http;
using tcp = boost::asio::ip::tcp;

namespace {

Status connection_error(const beast::error_code& ec, std::string_view what, const std::string& host,
                        uint16_t port) {
  std::string message =
      std::string(what) + " http://" + host + ":" + std::to_string(port) + ": " + ec.message();
  if (ec == beast::error::timeout) return deadline_exceeded(message);
  return unavailable(message);
}

http::request<http::string_body> make_request(const std::string& host, std::string_view method,
                                              std::string_view target, std::string_view body,
                                              std::string_view api_key) {
  http::request<http::string_body> request{
      http::string_to_verb(boost::beast::string_view(method.data(), method.size())),
      std::string(target), 11};
  request.set(http::field::host, host);
  request.set(http::field::user_agent, "baton");
  if (!api_key.empty()) request.set(http::field::authorization, "Bearer " + std::string(api_key));
  if (!body.empty() || method == "POST") {
    request.set(http::field::content_type, "application/json");
    request.body() = std::string(body);
    request.prepare_payload();
  }
  return request;
}

template <typename Header>
void fill_headers(const Header& header, HttpResponse* out) {
  out->status = int(header.result_int());
  out->content_type = std::string(header[http::field::content_type]);
  out->retry_after = std::string(header[http::field::retry_after]);
  out->allow = std::string(header[http::field::allow]);
}

// Starts one asynchronous operation (`start(handler)`) and runs `io` until
// it completes: by itself, or with beast::error::timeout at the stream's
// expiry.
template <typename Start>
beast::error_code run_one(boost::asio::io_context& io, Start start) {
  beast::error_code result = boost::asio::error::would_block;
  start([&result](beast::error_code ec, auto&&...) { result = ec; });
  io.restart();
  io.run();
  return result;
}

// Connects and sends the request; the stream's deadline covers the whole exchange.
Status open_and_send(beast::tcp_stream& stream, boost::asio::io_context& io,
                     const std::string& host, uint16_t port, std::string_view method,
                     std::string_view target, std::string_view body,
                     std::chrono::milliseconds timeout, std::string_view api_key) {
  beast::error_code ec;
  tcp::resolver resolver(io);
  auto endpoints = resolver.resolve(host, std::to_string(port), ec);
  if (ec) return connection_error(ec, "resolving", host, port);
  stream.expires_after(timeout);
  ec = run_one(io, [&](auto handler) { stream.async_connect(endpoints, handler); });
  if (ec) return connection_error(ec, "connecting to", host, port);
  auto request = make_request(host, method, target, body, api_key);
  ec = run_one(io, [&](auto handler) { http::async_write(stream, request, handler); });
  if (ec) return connection_error(ec, "writing to", host, port);
  return Status::ok();
}

}  // namespace

Result<HttpResponse> http_request(const std::string& host, uint16_t port, std::string_view method,
                                  std::string_view target, std::string_view body,
                                  std::chrono::milliseconds timeout, std::string_view api_key) {
  boost::asio::io_context io;
  beast::tcp_stream stream(io);
  BATON_RETURN_IF_ERROR(
      open_and_send(stream, io, host, port, method, target, body, timeout, api_key));
  beast::error_code ec;
  beast::flat_buffer buffer;
  http::response_parser<http::string_body> parser;
  parser.body_limit(256u << 20);
  // A HEAD reply's Content-Length describes the body a GET would get.
  parser.skip(method == "HEAD");
  ec = run_one(io, [&](auto handler) { http::async_read(stream, buffer, parser, handler); });
  if (ec) return connection_error(ec, "reading from", host, port);
  HttpResponse response;
  fill_headers(parser.get(), &response);
  response.body = std::move(parser.get().body());
  stream.socket().shutdown(tcp::socket::shutdown_both, ec);
  return response;
}

Result<HttpResponse> http_stream(const std::string& host, uint16_t port, std::string_view target,
                                 std::string_view body,
                                 const std::function<bool(std::string_view)>& on_data,
                                 std::chrono::milliseconds timeout, std::string_view api_key) {
  boost::asio::io_context io;
  beast::tcp_stream stream(io);
  BATON_RETURN_IF_ERROR(
      open_and_send(stream, io, host, port, "POST", target, body, timeout, api_key));
  beast::error_code ec;
  beast::flat_buffer buffer;
  http::response_parser<http::buffer_body> parser;
  // Not boost::none: Beast 1.74 compares a Content-Length against an empty
  // optional as if it were a limit of 0, failing every non-streamed reply.
  parser.body_limit(std::numeric_limits<std::uint64_t>::max());
  ec = run_one(io, [&](auto handler) { http::async_read_header(stream, buffer, parser, handler); });
  if (ec) return connection_error(ec, "reading from", host, port);
  HttpResponse response;
  fill_headers(parser.get(), &response);
  char chunk[16384];
  while (!parser.is_done()) {
    parser.get().body().data = chunk;
    parser.get().body().size = sizeof(chunk);
    // read_some returns as soon as some body bytes arrived; read() would wait
    // until the buffer is full, delivering SSE events late and in bursts.
    ec = run_one(io, [&](auto handler) { http::async_read_some(stream, buffer, parser, handler); });
    if (ec == http::error::need_buffer) ec = {};
    if (ec) return connection_error(ec, "reading from", host, port);
    size_t got = sizeof(chunk) - parser.get().body().size;
    if (got > 0 && !on_data(std::string_view(chunk, got)))
      break;  // hang up: the server sees a disconnect
  }
  stream.socket().shutdown(tcp::socket::shutdown_both, ec);
  stream.socket().close(ec);
  return response;
}

}  // namespace baton::tools
