// router/zmq_frontend.cc — framing between ZeroMQ clients and the routes.
#include "router/zmq_frontend.h"

#include <spdlog/spdlog.h>

#include <zmq.hpp>
#include <zmq_addon.hpp>

#include <cerrno>
#include <cstring>

#include "common/zap_handler.h"
#include "router/api_error.h"
#include "router/zmq_request.h"

namespace baton::router {

using namespace std::chrono_literals;

namespace {

// Replies libzmq holds for one client, in messages: few, so that what a
// client leaves unread waits in the front end's own queue, bounded in bytes.
constexpr int kClientSendHighWaterMark = 16;
// Requests libzmq holds from one client: the front end reads them as they
// come (their work waits for the request workers, bounded there), so a
// full pipe means a stalled front end, and TCP then holds the client back.
constexpr int kClientReceiveHighWaterMark = 256;
// How soon replies waiting for a client's pipe to drain are tried again,
// when the socket cannot say (it says only that some client's pipe has room).
constexpr auto kUnsentRetryInterval = 1ms;
// What libzmq may still send of a client's replies once the front end closes.
constexpr int kCloseLingerMs = 200;
// Requests read in one pass of the loop: a client that sends faster than the
// loop reads must not keep it from sending replies (everyone's, streamed
// tokens included) and from dropping clients that stopped reading.
constexpr int kMaxRequestsPerPass = 64;

// A frame sent without blocking, again when a signal interrupted it; false
// when the client's pipe is full (only a message's first frame can be).
bool send_frame(zmq::socket_t& socket, zmq::const_buffer frame, zmq::send_flags flags) {
  while (true) {
    try {
      return bool(socket.send(frame, flags | zmq::send_flags::dontwait));
    } catch (const zmq::error_t& e) {
      if (e.num() != EINTR) throw;
    }
  }
}

}  // namespace

struct ZmqFrontend::Sockets {
  zmq::context_t context{1};
  std::unique_ptr<control::ZapHandler> zap;  // when keyed; outlives the socket
  zmq::socket_t socket;
  zmq::socket_t monitor;  // the socket's disconnect events
};

// An HttpResponder whose bytes go out as [tag, status, payload] frames.
class ZmqFrontend::Responder final : public HttpResponder {
 public:
  Responder(ZmqFrontend* frontend, std::string identity, std::string tag)
      : frontend_(frontend),
        link_(frontend->link_),
        identity_(std::move(identity)),
        tag_(std::move(tag)) {}
  // A handler that let go of its request without a reply (an exception on a
  // worker) would leave the client waiting for good, since the protocol has
  // no reply timeout: it gets a 500 as over HTTP, and a stream a 500 frame
  // with the error and then its [DONE]. Cancelled responders (the client
  // left, the front end stops) are done and post nothing, and none posts
  // through the link once the front end is being destroyed.
  ~Responder() override {
    if (state_ == kDone) return;
    spdlog::warn("zmq front end: a request was dropped without a reply");
    const std::string error =
        api_error_from_status(internal_error("the request was dropped without a reply"))
            .to_json()
            .dump();
    const bool streaming = state_ == kStreaming;
    std::lock_guard lock(link_->mutex);
    if (link_->frontend == nullptr) return;
    if (!streaming) tell_reply(500);
    link_->frontend->post(identity_, tag_, 500, error, !streaming);
    if (streaming) link_->frontend->post(identity_, tag_, 500, "[DONE]", true);
  }

  void respond(int status, std::string, std::string body,
               std::vector<std::pair<std::string, std::string>>) override {
    std::lock_guard lock(mutex_);
    if (state_ != kIdle) return;
    state_ = kDone;
    tell_reply(status);
    frontend_->post(identity_, tag_, status, std::move(body), true);
  }
  void start_stream(int status, std::string) override {
    std::lock_guard lock(mutex_);
    if (state_ != kIdle) return;
    state_ = kStreaming;
    status_ = status;
    tell_reply(status);
  }
  void write(std::string chunk) override {
    std::lock_guard lock(mutex_);
    if (state_ != kStreaming) return;
    // SSE framing ("data: ...\n\n") is HTTP's; a frame carries the event itself.
    std::string_view event(chunk);
    if (event.starts_with("data: ")) event.remove_prefix(6);
    while (event.ends_with('\n')) event.remove_suffix(1);
    const bool last = event == "[DONE]";
    // Done with its last frame, not at finish() after it: a client that
    // reads [DONE] may at once reuse the tag.
    if (last) state_ = kDone;
    frontend_->post(identity_, tag_, status_, std::string(event), last);
  }
  void finish() override {
    std::lock_guard lock(mutex_);
    state_ = kDone;
  }
  bool closed() const override {
    std::lock_guard lock(mutex_);
    return cancelled_;
  }
  void on_close(std::function<void()> cb) override {
    std::unique_lock lock(mutex_);
    if (cancelled_) {
      lock.unlock();
      cb();
      return;
    }
    on_close_ = std::move(cb);
  }
  // False where it had ended already (its last frame is posted).
  bool cancel() {
    std::function<void()> cb;
    {
      std::lock_guard lock(mutex_);
      if (cancelled_ || state_ == kDone) return false;
      cancelled_ = true;
      state_ = kDone;
      cb = std::move(on_close_);
    }
    if (cb) cb();
    return true;
  }
  bool done() const {
    std::lock_guard lock(mutex_);
    return state_ == kDone;
  }

 private:
  enum State { kIdle, kStreaming, kDone };
  void tell_reply(int status) {
    if (frontend_->config_.on_reply) frontend_->config_.on_reply(status);
  }

  ZmqFrontend* frontend_;
  std::shared_ptr<Link> link_;
  std::string identity_, tag_;
  mutable std::mutex mutex_;
  State state_ = kIdle;
  int status_ = 200;
  bool cancelled_ = false;
  std::function<void()> on_close_;
};

Result<std::unique_ptr<ZmqFrontend>> ZmqFrontend::start(const ZmqFrontendConfig& config,
                                                        OpenAiService* service) {
  std::unique_ptr<ZmqFrontend> frontend(new ZmqFrontend());
  frontend->service_ = service;
  frontend->link_->frontend = frontend.get();
  frontend->config_ = config;
  frontend->sockets_ = std::make_unique<Sockets>();
  try {
    Sockets& s = *frontend->sockets_;
    if (config.keys) {
      BATON_ASSIGN_OR_RETURN(s.zap,
                             control::ZapHandler::start(s.context, config.keys->client.public_key,
                                                        "ZeroMQ front end"));
    }
    s.socket = zmq::socket_t(s.context, zmq::socket_type::router);
    if (config.keys) control::make_curve_server(s.socket, *config.keys, "baton-clients");
    s.socket.set(zmq::sockopt::sndhwm, kClientSendHighWaterMark);
    s.socket.set(zmq::sockopt::rcvhwm, kClientReceiveHighWaterMark);
    // A full pipe refuses a send (EAGAIN) instead of dropping it unseen.
    s.socket.set(zmq::sockopt::router_mandatory, 1);
    // Bodies up to twice the limit still get their 413; libzmq drops the
    // connection of a client that sends a larger message.
    s.socket.set(zmq::sockopt::maxmsgsize, int64_t(2 * config.max_body_bytes + (1 << 20)));
    s.socket.set(zmq::sockopt::linger, 0);
    // A client that stops answering ZMTP pings counts as gone.
    s.socket.set(zmq::sockopt::heartbeat_ivl, control::kZmtpHeartbeatIntervalMs);
    s.socket.set(zmq::sockopt::heartbeat_timeout, control::kZmtpHeartbeatTimeoutMs);
    const std::string monitor = "inproc://zmq-frontend-monitor";
    if (zmq_socket_monitor(s.socket.handle(), monitor.c_str(), ZMQ_EVENT_DISCONNECTED) != 0) {
      throw zmq::error_t();
    }
    s.monitor = zmq::socket_t(s.context, zmq::socket_type::pair);
    s.monitor.connect(monitor);
    s.socket.bind(config.endpoint);
  } catch (const zmq::error_t& e) {
    return unavailable("ZeroMQ front end: cannot bind " + config.endpoint + ": " + e.what());
  }
  frontend->thread_ = std::thread([f = frontend.get()] { f->loop(); });
  return frontend;
}

ZmqFrontend::~ZmqFrontend() {
  {
    std::lock_guard lock(link_->mutex);
    link_->frontend = nullptr;
  }
  stop_ = true;
  wake_.signal();
  if (thread_.joinable()) thread_.join();
  // Replies already handed to libzmq get a moment to reach their clients.
  sockets_->socket.set(zmq::sockopt::linger, kCloseLingerMs);
  // Requests still running (on a worker, or in the core) hold responders
  // that point here: cancelled, they post nothing to a front end that is gone.
  for (auto& [key, weak] : live_) {
    if (auto responder = weak.lock()) responder->cancel();
  }
}

std::string ZmqFrontend::endpoint() const {
  return sockets_->socket.get(zmq::sockopt::last_endpoint);
}

void ZmqFrontend::post(std::string identity, std::string tag, int status, std::string payload,
                       bool last) {
  {
    std::lock_guard lock(outbox_mutex_);
    outbox_.push_back({std::move(identity), std::move(tag), status, std::move(payload), last});
  }
  wake_.signal();
}

bool ZmqFrontend::replies_out() const {
  std::lock_guard lock(outbox_mutex_);
  return outbox_.empty() && unsent_clients_.load() == 0;
}

void ZmqFrontend::loop() {
  zmq::socket_t& socket = sockets_->socket;
  bool progressed = false;  // the last pass sent a waiting reply
  while (!stop_) {
    // While replies wait and the last pass sent some, a pipe with room again
    // wakes the loop (POLLOUT: some client's pipe has room, maybe another's,
    // so a pass that sends nothing falls back to the timer).
    const bool waiting = !unsent_.empty();
    const short socket_events = ZMQ_POLLIN | (waiting && progressed ? ZMQ_POLLOUT : 0);
    zmq::pollitem_t items[3] = {{socket.handle(), 0, socket_events, 0},
                                {nullptr, wake_.fd(), ZMQ_POLLIN, 0},
                                {sockets_->monitor.handle(), 0, ZMQ_POLLIN, 0}};
    try {
      zmq::poll(items, 3, waiting ? kUnsentRetryInterval : 100ms);
      wake_.drain();
      // Disconnects first: a connection that closed before a new one took
      // its descriptor is forgotten before the new one's messages are read.
      handle_monitor_events();
      std::vector<Outgoing> outgoing;
      {
        std::lock_guard lock(outbox_mutex_);
        outgoing.swap(outbox_);
      }
      for (Outgoing& out : outgoing) {
        Unsent& waiting = unsent_[out.identity];
        waiting.bytes += out.payload.size();
        waiting.replies.push_back(std::move(out));
      }
      progressed = send_replies();
      unsent_clients_ = unsent_.size();
      receive_requests();
      // A tag's entry goes once its request is done (with its last reply:
      // a refusal of another request under the same tag leaves it).
      for (auto it = live_.begin(); it != live_.end();) {
        auto responder = it->second.lock();
        it = (!responder || responder->done()) ? live_.erase(it) : std::next(it);
      }
    } catch (const zmq::error_t& e) {
      if (!stop_ && e.num() != EINTR) spdlog::error("zmq front end: {}", e.what());
    }
  }
}

bool ZmqFrontend::try_send(const Outgoing& reply) {
  zmq::socket_t& socket = sockets_->socket;
  const std::string status = std::to_string(reply.status);
  const auto more = zmq::send_flags::sndmore;
  // The first frame is refused when the client's pipe is full; once it is
  // taken the rest of the message is too.
  if (!send_frame(socket, zmq::buffer(reply.identity), more)) return false;
  send_frame(socket, zmq::buffer(reply.tag), more);
  send_frame(socket, zmq::buffer(status), more);
  send_frame(socket, zmq::buffer(reply.payload), zmq::send_flags::none);
  return true;
}

bool ZmqFrontend::send_replies() {
  const auto now = std::chrono::steady_clock::now();
  bool progressed = false;
  for (auto it = unsent_.begin(); it != unsent_.end();) {
    const std::string identity = it->first;
    Unsent& waiting = it->second;
    bool gone = false;
    while (!waiting.replies.empty()) {
      try {
        if (!try_send(waiting.replies.front())) break;
      } catch (const zmq::error_t& e) {
        if (e.num() != EHOSTUNREACH) throw;
        gone = true;  // the client went away: its replies have no one to go to
        break;
      }
      waiting.bytes -= waiting.replies.front().payload.size();
      waiting.replies.pop_front();
      waiting.last_sent = now;
      progressed = true;
    }
    // As HTTP judges a client: one that leaves more than the bound waiting
    // behind the reply going out, or reads nothing of it for the write
    // timeout, has stopped reading.
    const size_t behind =
        waiting.replies.empty() ? 0 : waiting.bytes - waiting.replies.front().payload.size();
    const bool stalled =
        !waiting.replies.empty() && (behind > config_.max_queued_reply_bytes ||
                                     now - waiting.last_sent > config_.write_timeout);
    if (stalled) {
      spdlog::warn(
          "zmq front end: dropping {} replies ({} bytes) to a client that stopped reading; its "
          "requests are cancelled",
          waiting.replies.size(), waiting.bytes);
    }
    if (gone || stalled || waiting.replies.empty()) {
      it = unsent_.erase(it);
    } else {
      ++it;
    }
    if (stalled) cancel_client(identity, "it stopped reading");
  }
  return progressed;
}

void ZmqFrontend::handle_monitor_events() {
  while (true) {
    std::vector<zmq::message_t> event;
    if (!zmq::recv_multipart(sockets_->monitor, std::back_inserter(event),
                             zmq::recv_flags::dontwait)) {
      return;
    }
    // Frame 1: a 16-bit event and a 32-bit value (the descriptor).
    if (event.empty() || event[0].size() < 6) continue;
    uint16_t id;
    uint32_t fd;
    std::memcpy(&id, event[0].data(), sizeof id);
    std::memcpy(&fd, static_cast<const char*>(event[0].data()) + 2, sizeof fd);
    if (id != ZMQ_EVENT_DISCONNECTED) continue;
    auto it = identities_by_fd_.find(int(fd));
    if (it == identities_by_fd_.end()) continue;
    for (const std::string& identity : it->second) {
      cancel_client(identity, "it went away");
      unsent_.erase(identity);
    }
    identities_by_fd_.erase(it);
  }
}

void ZmqFrontend::cancel_client(const std::string& identity, const char* why) {
  size_t cancelled = 0;
  for (auto it = live_.lower_bound({identity, std::string()});
       it != live_.end() && it->first.first == identity;) {
    if (auto responder = it->second.lock()) {
      responder->cancel();
      ++cancelled;
    }
    it = live_.erase(it);
  }
  if (cancelled > 0) {
    spdlog::info("zmq front end: cancelled a client's {} running request(s): {}", cancelled, why);
  }
}

void ZmqFrontend::receive_requests() {
  zmq::socket_t& socket = sockets_->socket;
  // More waiting keeps the socket readable: the next poll returns at once.
  for (int taken = 0; taken < kMaxRequestsPerPass; ++taken) {
    std::vector<zmq::message_t> parts;
    auto received =
        zmq::recv_multipart(socket, std::back_inserter(parts), zmq::recv_flags::dontwait);
    if (!received) break;
    if (parts.empty()) continue;
    std::vector<std::string_view> frames;
    for (size_t i = 1; i < parts.size(); ++i) frames.push_back(parts[i].to_string_view());
    Result<ZmqRequest> read = read_zmq_request(frames, config_.max_body_bytes);
    if (!read.is_ok()) {
      rejected_++;
      if (uint64_t unlogged = 0; drop_log_.should_log(&unlogged)) {
        spdlog::warn("zmq front end: dropped {}{}", read.status().message(),
                     unlogged == 0 ? std::string()
                                   : " (and " + std::to_string(unlogged) +
                                         " more malformed messages since the last report)");
      }
      continue;
    }
    const std::string identity = parts[0].to_string();
    const LiveKey key{identity, read->tag};
    // The connection it came on (identities are per connection), so that its
    // closing cancels what it asked for. A connection that closed while this
    // loop ran may have left its descriptor to this message's: libzmq queues
    // its DISCONNECTED event before it closes the descriptor, so reading the
    // pending events first keeps that event from cancelling this client.
    if (const int fd = parts[1].get(ZMQ_SRCFD); fd >= 0) {
      handle_monitor_events();
      identities_by_fd_[fd].insert(identity);
    }
    if (read->kind == ZmqRequest::Kind::kCancel) {
      bool cancelled = false;
      if (auto it = live_.find(key); it != live_.end()) {
        if (auto responder = it->second.lock()) cancelled = responder->cancel();
        live_.erase(it);
      }
      // Answered behind every reply the request had posted (a cancelled
      // responder posts nothing more, and one posting finished before
      // cancel() took its lock): once the client reads this, no frame of
      // the old request follows and the tag is free again.
      if (config_.on_reply) config_.on_reply(200);
      post(identity, read->tag, 200, cancelled ? R"({"cancelled":true})" : R"({"cancelled":false})",
           true);
      continue;
    }
    auto responder = std::make_shared<Responder>(this, identity, read->tag);
    if (read->kind == ZmqRequest::Kind::kTooLarge) {
      // The same limit and answer as the HTTP front end's.
      ApiError error;
      error.http_status = 413;
      error.type = "BadRequestError";
      error.message =
          "request body exceeds the limit of " + std::to_string(config_.max_body_bytes) + " bytes";
      responder->respond(413, "application/json", error.to_json().dump(), {});
      continue;
    }
    // A tag names one running request of its client: a second one could
    // not be told apart in the replies nor cancelled.
    if (auto running = live_.find(key); running != live_.end()) {
      auto other = running->second.lock();
      if (other && !other->done()) {
        ApiError error;
        error.http_status = 400;
        error.type = "BadRequestError";
        error.message = "the tag is in use by a running request of this client";
        responder->respond(400, "application/json", error.to_json().dump(), {});
        continue;
      }
    }
    live_[key] = responder;
    HttpRequest request = std::move(read->request);
    // Nothing a client sends may end the front end's thread: a handler
    // that throws answers this request with a 500, as HTTP does.
    try {
      service_->handle(std::move(request), responder);
    } catch (const std::exception& e) {
      spdlog::error("zmq front end: handler threw: {}", e.what());
      if (!responder->done()) {
        responder->respond(500, "application/json",
                           api_error_from_status(internal_error("internal error")).to_json().dump(),
                           {});
      }
    }
  }
}

}  // namespace baton::router
