// router/zmq_frontend.h — the ZeroMQ client front end (docs/API.md).
//
// A ROUTER socket for high-rate clients (DEALER sockets). A request is one
// multipart message [tag, path, body] or [tag, path, body, api key] (with
// API keys configured, as HTTP's Authorization: Bearer): `tag` is the client's own id for the
// request (echoed on every reply, at most 256 bytes), `path` one of the HTTP
// routes ("/v1/completions", "/v1/chat/completions", "/v1/models",
// "/health", "/metrics", "/v1/nodes") or "cancel" (ends the request `tag`,
// answered {"cancelled": true|false} after the request's last frame),
// `body` the same JSON as over HTTP. Replies are [tag, status, payload]:
// a whole JSON body; or, for a streamed request, one message per SSE event
// holding its JSON, then a last one holding "[DONE]". The same routes and
// validation serve both front ends (OpenAiService); only the framing differs.
// With router.zmq_keys the socket is a CURVE server (common/curve_keys.h):
// connections are encrypted and only holders of the client key get in.
#pragma once

#include <atomic>
#include <chrono>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "common/control_socket.h"
#include "common/log_throttle.h"
#include "common/status.h"
#include "router/openai_service.h"
#include "router/zmq_request.h"

namespace baton::router {

struct ZmqFrontendConfig {
  std::string endpoint;                          // tcp://host:port
  size_t max_body_bytes = kMaxRequestBodyBytes;  // larger bodies: 413, as over HTTP
  // A client with more than max_queued_reply_bytes of replies waiting
  // behind the one going out (besides the 16 libzmq holds for it), or that
  // reads none of it for write_timeout, has stopped reading: its requests
  // are cancelled and those replies dropped (HTTP closes such a client's
  // connection: router.max_queued_write_bytes, router.write_timeout_ms).
  size_t max_queued_reply_bytes = 4u << 20;
  std::chrono::milliseconds write_timeout{30000};
  // A CURVE server admitting only holders of keys->client; none: in the clear.
  std::optional<control::CurveKeys> keys;
  // Told (on any thread) the status of each reply as it is posted, the
  // frontend's own errors among them; not of one to a client gone. Optional.
  std::function<void(int status)> on_reply;
};

class ZmqFrontend {
 public:
  // A client that goes away (its connection closes, or it stops answering
  // ZMTP heartbeats) has its running requests cancelled, as an HTTP client
  // that hangs up does: the nodes stop and free their KV blocks.
  static Result<std::unique_ptr<ZmqFrontend>> start(const ZmqFrontendConfig& config,
                                                    OpenAiService* service);
  ~ZmqFrontend();
  std::string endpoint() const;

  // Queues a reply for the socket thread (any thread).
  void post(std::string identity, std::string tag, int status, std::string payload, bool last);
  // Every reply posted so far is handed to libzmq (or dropped with its client).
  bool replies_out() const;
  uint64_t rejected() const { return rejected_.load(); }

 private:
  struct Sockets;
  class Responder;
  // What a responder reaches the front end through when it is let go
  // without a reply: null once the front end is being destroyed (a
  // responder whose last owner lets go on another thread then may be
  // destroyed after it).
  struct Link {
    std::mutex mutex;
    ZmqFrontend* frontend = nullptr;
  };
  struct Outgoing {
    std::string identity, tag;
    int status;
    std::string payload;
    bool last;
  };
  // Replies to one client that libzmq would not take yet (its pipe full).
  struct Unsent {
    std::deque<Outgoing> replies;
    size_t bytes = 0;
    std::chrono::steady_clock::time_point last_sent = std::chrono::steady_clock::now();
  };
  ZmqFrontend() = default;
  void loop();
  // Hands each client's waiting replies to libzmq, in order, until its pipe
  // is full; drops a client that stopped reading. True when it sent any.
  bool send_replies();
  // false when the client's pipe is full; throws for other errors.
  bool try_send(const Outgoing& reply);
  void receive_requests();
  // Monitor events: a disconnected connection cancels its clients' requests.
  void handle_monitor_events();
  void cancel_client(const std::string& identity, const char* why);

  std::unique_ptr<Sockets> sockets_;
  std::shared_ptr<Link> link_ = std::make_shared<Link>();
  OpenAiService* service_ = nullptr;
  control::WakeFd wake_;
  mutable std::mutex outbox_mutex_;
  std::vector<Outgoing> outbox_;
  ZmqFrontendConfig config_;
  // Live requests by (identity, tag), so "cancel" can reach them (socket
  // thread only). A pair, not the two joined: identities and tags may hold
  // any bytes, so no separator tells where one ends.
  using LiveKey = std::pair<std::string, std::string>;
  std::map<LiveKey, std::weak_ptr<Responder>> live_;
  // The client identities seen on each connection (by its file descriptor),
  // to cancel their requests when it closes (socket thread only).
  std::unordered_map<int, std::unordered_set<std::string>> identities_by_fd_;
  // Waiting replies by client identity (socket thread only), and how many
  // clients have some, for replies_out() on any thread.
  std::unordered_map<std::string, Unsent> unsent_;
  std::atomic<size_t> unsent_clients_{0};
  std::atomic<uint64_t> rejected_{0};
  LogThrottle drop_log_;  // the front end's thread: one line a second for malformed messages
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace baton::router
