#include "tools/loadtest/bench_client.h"

#include <nlohmann/json.hpp>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "common/zap_handler.h"

#include "tools/loadtest/bench_runner.h"
#include "tools/loadtest/stream_record.h"

namespace baton::loadtest {
namespace {

using json = nlohmann::json;

// At most this much of an error body goes into a failed request's text.
constexpr size_t kMaxErrorBytes = 2048;

// "HTTP 400: <the error's message>" from a status and an error body.
std::string http_error(int status, const std::string& body) {
  json parsed = json::parse(body, nullptr, /*allow_exceptions=*/false);
  std::string message = body.substr(0, kMaxErrorBytes);
  if (parsed.is_object() && parsed.contains("error") && parsed["error"].is_object() &&
      parsed["error"].value("message", json()).is_string()) {
    message = parsed["error"]["message"];
  }
  return "HTTP " + std::to_string(status) + ": " + message;
}

class HttpBenchClient final : public BenchClient {
 public:
  explicit HttpBenchClient(ServerAddress address) : address_(std::move(address)) {}

  RequestRecord stream(const std::string& path, const std::string& body,
                       int64_t prompt_len) override {
    SseSplitter splitter;
    std::string raw;  // the body, for an error reply that is not SSE
    StreamRecorder recorder(Clock::now(), prompt_len);
    auto response = tools::http_stream(
        address_.host, address_.port, path, body,
        [&](std::string_view bytes) {
          const auto at = Clock::now();
          if (raw.size() < kMaxErrorBytes) raw.append(bytes.substr(0, kMaxErrorBytes - raw.size()));
          splitter.feed(bytes, [&](std::string_view payload) { recorder.on_event(payload, at); });
          return !recorder.done();
        },
        address_.timeout, address_.api_key);
    if (!response.is_ok()) {
      recorder.fail(response.status().message());
    } else if (response->status != 200) {
      recorder.fail(http_error(response->status, raw));
    }
    return recorder.finish();
  }

  Result<tools::HttpResponse> get(const std::string& path) override {
    return tools::http_request(address_.host, address_.port, "GET", path, {}, address_.timeout,
                               address_.api_key);
  }

 private:
  ServerAddress address_;
};

zmq::context_t& zmq_context() {
  // A socket per worker: more than libzmq's default of 1023 may run.
  static zmq::context_t context = [] {
    zmq::context_t made(1);
    zmq_ctx_set(made.handle(), ZMQ_MAX_SOCKETS, int(kMaxInFlight) + 64);
    return made;
  }();
  return context;
}

class ZmqBenchClient final : public BenchClient {
 public:
  static constexpr std::chrono::seconds kGetTimeout{10};

  explicit ZmqBenchClient(ServerAddress address)
      : address_(std::move(address)), socket_(zmq_context(), zmq::socket_type::dealer) {
    socket_.set(zmq::sockopt::linger, 0);
    if (address_.zmq_keys) control::make_curve_client(socket_, *address_.zmq_keys);
    socket_.connect("tcp://" + address_.host + ":" + std::to_string(address_.port));
  }

  RequestRecord stream(const std::string& path, const std::string& body,
                       int64_t prompt_len) override {
    StreamRecorder recorder(Clock::now(), prompt_len);
    const std::string tag = next_tag();
    if (Status sent = send(tag, path, body); !sent.is_ok()) {
      recorder.fail(sent.message());
      return recorder.finish();
    }
    const auto deadline = Clock::now() + address_.timeout;
    while (!recorder.done()) {
      Result<Reply> reply = receive(tag, deadline);
      if (!reply.is_ok()) {
        recorder.fail(reply.status().message());
        (void)send(tag, "cancel", "");  // best effort: free the router's work
        break;
      }
      if (reply->status != 200) {
        recorder.fail(http_error(reply->status, reply->payload));
        break;
      }
      recorder.on_event(reply->payload, reply->at);
    }
    return recorder.finish();
  }

  // A GET is answered by the router itself, at once: the bench asks one
  // before it starts, and a DEALER connected to no one would otherwise
  // wait out the whole request timeout.
  Result<tools::HttpResponse> get(const std::string& path) override {
    const std::string tag = next_tag();
    BATON_RETURN_IF_ERROR(send(tag, path, ""));
    const auto wait = std::min<Clock::duration>(address_.timeout, kGetTimeout);
    Result<Reply> answered = receive(tag, Clock::now() + wait);
    if (!answered.is_ok() && answered.status().code() == StatusCode::kDeadlineExceeded) {
      return unavailable(
          "no reply from " + endpoint() + " within " +
          std::to_string(std::chrono::duration_cast<std::chrono::seconds>(wait).count()) +
          " s: is a router's zmq_port there?");
    }
    BATON_ASSIGN_OR_RETURN(Reply reply, std::move(answered));
    tools::HttpResponse response;
    response.status = reply.status;
    response.body = std::move(reply.payload);
    return response;
  }

 private:
  struct Reply {
    int status = 0;
    std::string payload;
    Clock::time_point at;
  };

  std::string next_tag() { return "bench-" + std::to_string(++tag_counter_); }

  Status send(const std::string& tag, const std::string& path, const std::string& body) {
    try {
      socket_.send(zmq::buffer(tag), zmq::send_flags::sndmore);
      socket_.send(zmq::buffer(path), zmq::send_flags::sndmore);
      const bool keyed = !address_.api_key.empty() && path != "cancel";
      socket_.send(zmq::buffer(body), keyed ? zmq::send_flags::sndmore : zmq::send_flags::none);
      if (keyed) socket_.send(zmq::buffer(address_.api_key), zmq::send_flags::none);
    } catch (const zmq::error_t& e) {
      return unavailable("sending to " + endpoint() + ": " + e.what());
    }
    return Status::ok();
  }

  // The next reply for `tag`; replies to earlier, abandoned tags are dropped.
  Result<Reply> receive(const std::string& tag, Clock::time_point deadline) {
    for (;;) {
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      if (left.count() <= 0)
        return deadline_exceeded("no reply from " + endpoint() + " within the request timeout");
      std::vector<zmq::message_t> parts;
      try {
        zmq::pollitem_t item = {socket_.handle(), 0, ZMQ_POLLIN, 0};
        if (zmq::poll(&item, 1, left) == 0) continue;
        if (!zmq::recv_multipart(socket_, std::back_inserter(parts), zmq::recv_flags::dontwait))
          continue;
      } catch (const zmq::error_t& e) {
        return unavailable("receiving from " + endpoint() + ": " + e.what());
      }
      const auto at = Clock::now();
      if (parts.size() != 3 || parts[0].to_string() != tag) continue;
      Reply reply;
      reply.status = std::atoi(parts[1].to_string().c_str());
      reply.payload = parts[2].to_string();
      reply.at = at;
      return reply;
    }
  }

  std::string endpoint() const {
    return "tcp://" + address_.host + ":" + std::to_string(address_.port);
  }

  ServerAddress address_;
  zmq::socket_t socket_;
  uint64_t tag_counter_ = 0;
};

}  // namespace

Result<Backend> parse_backend(const std::string& name) {
  if (name == "http") return Backend::kHttp;
  if (name == "zmq") return Backend::kZmq;
  return invalid_argument("--backend must be http or zmq, got '" + name + "'");
}

const char* backend_name(Backend backend) { return backend == Backend::kHttp ? "http" : "zmq"; }

Result<std::unique_ptr<BenchClient>> connect_client(const ServerAddress& address) {
  if (address.backend == Backend::kHttp)
    return std::unique_ptr<BenchClient>(new HttpBenchClient(address));
  try {
    return std::unique_ptr<BenchClient>(new ZmqBenchClient(address));
  } catch (const zmq::error_t& e) {
    return unavailable("connecting to tcp://" + address.host + ":" + std::to_string(address.port) +
                       ": " + e.what());
  }
}

Result<std::string> served_model(BenchClient& client) {
  BATON_ASSIGN_OR_RETURN(tools::HttpResponse response, client.get("/v1/models"));
  if (response.status != 200)
    return unavailable("/v1/models: " + http_error(response.status, response.body));
  json doc = json::parse(response.body, nullptr, /*allow_exceptions=*/false);
  if (!doc.is_object() || !doc.contains("data") || !doc["data"].is_array() || doc["data"].empty() ||
      !doc["data"][0].is_object() || !doc["data"][0].value("id", json()).is_string()) {
    return unavailable("/v1/models: no model in the reply: " +
                       response.body.substr(0, kMaxErrorBytes));
  }
  return doc["data"][0]["id"].get<std::string>();
}

}  // namespace baton::loadtest
