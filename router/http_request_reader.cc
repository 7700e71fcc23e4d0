#include "router/http_request_reader.h"

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cstdio>
#include <random>

namespace baton::router {
namespace {

std::string_view to_std(boost::beast::string_view s) { return {s.data(), s.size()}; }

std::string lower_ascii(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

}  // namespace

std::string HttpRequest::header(std::string_view lower_name) const {
  for (const auto& [name, value] : headers) {
    if (name == lower_name) return value;
  }
  return "";
}

void limit_request_parser(RequestParser& parser, size_t max_body_bytes) {
  parser.header_limit(kMaxHeaderBytes);
  parser.body_limit(max_body_bytes);
}

HttpRequest to_http_request(
    boost::beast::http::request<boost::beast::http::string_body>&& message) {
  HttpRequest request;
  request.method = std::string(to_std(message.method_string()));
  request.target = std::string(to_std(message.target()));
  for (const auto& field : message) {
    request.headers.emplace_back(lower_ascii(to_std(field.name_string())),
                                 std::string(to_std(field.value())));
  }
  std::string id = request.header("x-request-id");
  if (!is_request_id_token(id)) id = make_request_id();
  std::erase_if(request.headers, [](const auto& h) { return h.first == "x-request-id"; });
  request.headers.emplace_back("x-request-id", std::move(id));
  request.body = std::move(message.body());
  return request;
}

bool is_request_id_token(std::string_view id) {
  if (id.empty() || id.size() > 128) return false;
  return std::all_of(id.begin(), id.end(), [](char c) { return c > ' ' && c < 127; });
}

std::string make_request_id() {
  static std::atomic<uint64_t> counter{0};
  thread_local std::mt19937_64 rng(std::random_device{}());
  char id[40];
  std::snprintf(id, sizeof(id), "%016llx%08llx", static_cast<unsigned long long>(rng()),
                static_cast<unsigned long long>(counter.fetch_add(1) & 0xffffffffu));
  return id;
}

}  // namespace baton::router
