// router/router_core.cc — the dispatcher loop.
#include "router/router_core.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <random>
#include <utility>

#include "router/node_output_check.h"

namespace baton::router {

std::string client_id_for_logs(std::string_view id) {
  std::string out;
  for (char c : id) {
    if (out.size() == control::kMaxClientIdBytes) break;
    if (c > ' ' && c < 0x7f) out += c;
  }
  return out;
}

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

// Longest the loop sleeps; bounds how late timeouts and node expiry are seen.
constexpr auto kLoopTick = 10ms;
// Frames read from the control socket per turn of the loop.
constexpr size_t kMaxMessagesPerPoll = 4096;

RouterCore::RouterCore(RouterCoreConfig config)
    : config_(std::move(config)), registry_(config_.nodes, config_.policy) {
  std::random_device entropy;
  last_registration_ = (uint64_t(entropy()) << 32 | entropy()) >> 2;  // room to count up
  // Request ids start anywhere in 48 bits too: nodes that outlive a router
  // may still hold its requests (a transfer's callback, a job draining),
  // and a restarted router counting from 1 again would hand them the same
  // ids, which they ignore as duplicates (the client then waits out its
  // timeout). 48 bits stay exact in any JSON reader.
  next_id_ = (uint64_t(entropy()) << 16 | (entropy() & 0xffffu)) + 1;
}

Result<std::unique_ptr<RouterCore>> RouterCore::start(RouterCoreConfig config) {
  std::unique_ptr<RouterCore> core(new RouterCore(std::move(config)));
  {
    BATON_ASSIGN_OR_RETURN(
        core->socket_, control::ControlSocket::bind(
                           core->config_.control_endpoint,
                           core->config_.control_keys ? &*core->config_.control_keys : nullptr));
  }
  core->publish_snapshot();
  core->thread_ = std::thread([c = core.get()] { c->loop(); });
  return core;
}

RouterCore::~RouterCore() { stop(); }

void RouterCore::stop() {
  if (stop_.exchange(true)) return;
  wake_.signal();
  if (thread_.joinable()) thread_.join();
}

Result<uint64_t> RouterCore::submit(GenerationRequest request, UpdateSink sink) {
  if (decode_up_.load() == 0) return unavailable("no decode node is up");
  if (in_flight_.fetch_add(1) >= config_.max_queued_requests) {
    in_flight_.fetch_sub(1);
    return resource_exhausted("the router holds " + std::to_string(config_.max_queued_requests) +
                              " requests, its limit; retry later");
  }
  uint64_t id = next_id_.fetch_add(1);
  {
    std::lock_guard lock(inbox_mutex_);
    // Stopped: the core's last pass over the inbox (under this lock) has
    // run or will fail what is queued; nothing would read a later one.
    if (stop_.load()) {
      in_flight_.fetch_sub(1);
      return unavailable("the router is shutting down");
    }
    submissions_.push_back({id, std::move(request), std::move(sink), Clock::now()});
  }
  wake_.signal();
  return id;
}

void RouterCore::cancel(uint64_t request_id) {
  {
    std::lock_guard lock(inbox_mutex_);
    cancels_.push_back(request_id);
  }
  wake_.signal();
}

std::shared_ptr<const ClusterSnapshot> RouterCore::snapshot() const {
  std::lock_guard lock(snapshot_mutex_);
  return snapshot_;
}

void RouterCore::loop() {
  auto next_snapshot = Clock::now();
  auto next_expiry_scan = Clock::now();
  while (!stop_.load()) {
    auto received = socket_->poll(kLoopTick, wake_.fd(), kMaxMessagesPerPoll);
    // Every frame queued by now is in `received`: a node is judged silent
    // as of this moment, not after the work below. A step that delivers a
    // large reply can take longer than the heartbeat timeout, and the
    // heartbeats that arrived meanwhile are read by the next poll.
    const auto polled_at = Clock::now();
    const bool socket_drained = received.size() < kMaxMessagesPerPoll;
    wake_.drain();
    for (auto& r : received) handle(r.from, r.message);

    std::vector<Submission> submissions;
    std::vector<uint64_t> cancels;
    {
      std::lock_guard lock(inbox_mutex_);
      submissions.swap(submissions_);
      cancels.swap(cancels_);
    }
    for (Submission& submission : submissions) submit_or_hold(submission);
    end_undeliverable();
    for (uint64_t id : cancels) {
      auto it = requests_.find(id);
      if (it == requests_.end()) {
        drop_held(id);
        continue;
      }
      abort_on_nodes(it->second, "cancelled by the client");
      forget(id);
    }
    // After the cancels: a first sample that failed fails its client's
    // whole request, whose other samples are then cancelled, not placed.
    release_groups();

    auto now = Clock::now();
    if (socket_drained) {
      for (const std::string& name : registry_.expire(polled_at, config_.heartbeat_timeout)) {
        node_down(name,
                  "no heartbeat for " + std::to_string(config_.heartbeat_timeout.count()) + " ms");
      }
    }
    // Deadlines are looked at every 10 ms, not every pass: a pass per
    // message would walk thousands of requests each time.
    std::vector<uint64_t> expired;
    if (now >= next_expiry_scan) {
      next_expiry_scan = now + 10ms;
      for (const auto& [id, request] : requests_) {
        if (now > request.deadline) expired.push_back(id);
      }
    }
    for (uint64_t id : expired) {
      fail(id, timed_out());
    }
    // A pass that placed requests publishes at once: a reply (built on a
    // request worker) can reach its client before this thread's next pass,
    // and /metrics and /v1/nodes then already count its placement.
    if (now >= next_snapshot || !received.empty() || !submissions.empty()) {
      publish_snapshot();
      next_snapshot = now + 50ms;
    }
  }
  // Shutting down: end what is left, so no client waits forever.
  end_undeliverable();
  std::vector<uint64_t> left;
  for (const auto& [id, request] : requests_) left.push_back(id);
  for (uint64_t id : left) fail(id, unavailable("the router is shutting down"));
  for (auto& [group, held] : std::exchange(groups_, {})) {
    for (Submission& s : held.held) {
      in_flight_.fetch_sub(1);
      call_sink(s.sink, failed_update(unavailable("the router is shutting down")));
    }
  }
  std::vector<Submission> submissions;
  {
    std::lock_guard lock(inbox_mutex_);
    submissions.swap(submissions_);
  }
  for (Submission& s : submissions) {
    in_flight_.fetch_sub(1);
    call_sink(s.sink, failed_update(unavailable("the router is shutting down")));
  }
}

void RouterCore::submit_or_hold(Submission& submission) {
  const uint64_t group_id = submission.request.prompt_group;
  if (group_id == 0) return dispatch(submission);
  auto [it, first] = groups_.try_emplace(group_id);
  PromptGroup& group = it->second;
  if (first) {
    const uint64_t leader = submission.id;
    group.leader = leader;
    dispatch(submission);
    auto placed = requests_.find(leader);
    if (placed == requests_.end()) {  // failed at once: the next sample leads
      groups_.erase(group_id);
      return;
    }
    const NodeState* decode = registry_.find(placed->second.decode_node);
    if (decode == nullptr || !decode->prefix_caching) {
      // Nothing would be shared there: the others go as any request.
      group.ready = true;
    } else if (placed->second.prefill_node.empty()) {
      // Computed on its decode node, where a sample admitted beside it
      // shares the blocks as the step computing them fills them.
      group.ready = true;
      group.decode_node = placed->second.decode_node;
    }
    return;
  }
  if (!group.ready) {
    group.held.push_back(std::move(submission));
    return;
  }
  dispatch(submission, group.decode_node);
}

void RouterCore::group_leader_moved(Request& leader, bool ended) {
  const uint64_t group_id = leader.request.prompt_group;
  auto it = groups_.find(group_id);
  if (group_id == 0 || it == groups_.end() || it->second.leader != leader.id) return;
  PromptGroup& group = it->second;
  if (!group.ready) {
    group.ready = true;
    // Ended before its first tokens (failed, cancelled): the others are
    // placed as any request is.
    if (!ended) group.decode_node = leader.decode_node;
    groups_to_release_.push_back(group_id);
  }
  if (ended) {
    group.leader_gone = true;
    groups_to_release_.push_back(group_id);
  }
}

Status RouterCore::timed_out() const {
  return deadline_exceeded("the request ran past the router's request timeout of " +
                           std::to_string(config_.request_timeout.count()) + " ms");
}

void RouterCore::release_groups() {
  for (const uint64_t group_id : std::exchange(groups_to_release_, {})) {
    auto it = groups_.find(group_id);
    if (it == groups_.end()) continue;
    std::vector<Submission> held = std::exchange(it->second.held, {});
    const std::string beside = it->second.decode_node;
    // Samples that come after their leader ended lead a group of their own.
    if (it->second.leader_gone) groups_.erase(it);
    const auto now = Clock::now();
    for (Submission& submission : held) {
      if (now > submission.submitted + config_.request_timeout) {
        in_flight_.fetch_sub(1);
        call_sink(submission.sink, failed_update(timed_out()));
        continue;
      }
      dispatch(submission, beside);
    }
  }
}

bool RouterCore::drop_held(uint64_t request_id) {
  for (auto& [group_id, group] : groups_) {
    auto it =
        std::ranges::find_if(group.held, [&](const Submission& s) { return s.id == request_id; });
    if (it == group.held.end()) continue;
    group.held.erase(it);
    in_flight_.fetch_sub(1);
    return true;
  }
  return false;
}

void RouterCore::dispatch(Submission& submission, const std::string& beside) {
  const std::vector<int32_t>& prompt = submission.request.prompt;
  while (true) {
    NodeState* decode = beside.empty() ? nullptr : registry_.find(beside);
    const bool cached_there = decode != nullptr && decode->up;
    if (!cached_there) decode = registry_.pick(Role::kDecode, prompt);
    if (decode == nullptr) {
      in_flight_.fetch_sub(1);
      call_sink(submission.sink, failed_update(unavailable("no decode node is up")));
      return;
    }
    const PrefillPlacement placement =
        cached_there ? PrefillPlacement::kCachedPrompt
                     : place_prefill(config_.placement, int64_t(prompt.size()),
                                     registry_.least_assigned_tokens(Role::kPrefill),
                                     decode->assigned_tokens);
    NodeState* prefill = placement == PrefillPlacement::kPrefillNode
                             ? registry_.pick(Role::kPrefill, prompt)
                             : nullptr;
    control::Generate generate;
    generate.request_id = submission.id;
    generate.prompt = prompt;
    generate.sampling = submission.request.sampling;
    generate.prefill_node = prefill != nullptr ? prefill->name : "";
    generate.client_id = submission.request.client_id;
    Status sent = send(decode->name, generate);
    if (!sent.is_ok()) {
      // Its connection is gone (it died before its heartbeats ran out): take
      // it out now and place the request elsewhere (`beside` is down now).
      std::string name = decode->name;
      registry_.mark_down(name);
      node_down(name, sent.message());
      continue;
    }
    Request& request = requests_[submission.id];
    request.id = submission.id;
    request.request = std::move(submission.request);
    request.sink = std::move(submission.sink);
    request.decode_node = decode->name;
    // From its submission: a sample held for its prompt's first is not
    // given a whole timeout more.
    request.deadline = submission.submitted + config_.request_timeout;
    decode->assigned_requests++;
    if (prefill != nullptr) {
      request.prefill_node = prefill->name;
      request.prefilled_by = prefill->name;
      prefill->assigned_requests++;
      prefill->assigned_tokens += int64_t(request.request.prompt.size());
    } else {
      // Beside a sample of the same prompt, only what follows its full
      // blocks is computed.
      const int32_t block = registry_.block_size();
      const auto tokens = int64_t(request.request.prompt.size());
      request.local_prefill_tokens =
          cached_there && block > 0 ? tokens - (tokens - 1) / block * block : tokens;
      decode->assigned_tokens += request.local_prefill_tokens;
    }
    placements_[placement]++;
    spdlog::debug("router: request {} (#{}): {} prompt tokens to {}, prefilled on {} ({})",
                  request.request.client_id, request.id, prompt.size(), decode->name,
                  prefill != nullptr ? prefill->name : "it", placement_name(placement));
    return;
  }
}

void RouterCore::handle(const std::string& from, control::Message& message) {
  if (auto* reg = std::get_if<control::Register>(&message)) return on_register(from, *reg);
  if (auto* heartbeat = std::get_if<control::Heartbeat>(&message)) {
    // Heartbeats come from the node's second socket, `<name>/heartbeat`.
    std::string_view suffix = control::kHeartbeatIdentitySuffix;
    bool from_heartbeat_socket = from.size() > suffix.size() && from.ends_with(suffix);
    std::string node = from_heartbeat_socket ? from.substr(0, from.size() - suffix.size()) : from;
    if (heartbeat->node != node ||
        !registry_.heartbeat(node, heartbeat->load, Clock::now(), std::move(heartbeat->kv_paths))) {
      // Naming the registration it came under: a heartbeat that crossed the
      // node's registering again is no reason to register once more.
      (void)send(node,
                 control::RegisterAck{false, "unknown or down node '" + node + "': register again",
                                      heartbeat->registration});
    }
    return;
  }
  if (auto* ready = std::get_if<control::PrefillReady>(&message))
    return on_prefill_ready(from, *ready);
  if (auto* done = std::get_if<control::PrefillDone>(&message)) return on_prefill_done(from, *done);
  if (auto* events = std::get_if<control::Events>(&message)) return on_events(from, *events);
  if (auto* rejected = std::get_if<control::Rejected>(&message))
    return on_rejected(from, *rejected);
  spdlog::warn("router: ignored an unexpected '{}' message from {}", control::message_type(message),
               from);
}

void RouterCore::on_register(const std::string& from, const control::Register& message) {
  if (message.node != from) {
    spdlog::warn("router: '{}' registered under the name '{}'; refused", from, message.node);
    (void)send(from, control::RegisterAck{false, "register under your routing id"});
    return;
  }
  NodeState* before = registry_.find(from);
  bool was_up = before != nullptr && before->up;
  const int64_t pid_before = before != nullptr ? before->pid : 0;
  // A Register from the process the router holds up (its retry sent
  // before the first welcome reached it) changes nothing. A restarted one
  // (even under the same pid, as in a container) has a new pool
  // descriptor: its transfer endpoint is made anew with the process.
  const bool same_process =
      was_up && message.pid == pid_before && message.descriptor == before->descriptor;
  Status status = registry_.register_node(message, Clock::now());
  if (!status.is_ok()) {
    spdlog::error("router: refused node registration: {}", status.message());
    (void)send(from, control::RegisterAck{false, status.message()});
    return;
  }
  // A node that comes back lost whatever it was doing.
  if (was_up && !same_process) node_down(from, "registered again: it restarted");
  spdlog::info("router: {} node {} registered (pid {})", role_name(message.role), from,
               message.pid);
  // Up for the front ends before the node hears so: a request sent once it
  // is welcomed must not find no decode node up.
  publish_snapshot();
  (void)send(from, control::RegisterAck{true, "welcome", ++last_registration_});
  // The same process back after it was declared dead (it only stopped)
  // still holds the requests failed meanwhile: a decode node's KV
  // reservations would wait out kv_wait_timeout otherwise.
  const std::deque<uint64_t> orphans = std::exchange(orphans_[from], {});
  if (message.pid == pid_before) {
    for (uint64_t id : orphans)
      (void)send(from, control::Abort{id, "failed while this node was declared dead"});
  }
  // Prefill nodes need every decode node's pool descriptor.
  if (message.role == Role::kDecode) {
    for (const auto& [name, node] : registry_.nodes()) {
      if (node.up && node.role == Role::kPrefill)
        (void)send(name, control::PeerInfo{from, message.descriptor});
    }
  } else {
    for (const auto& [name, node] : registry_.nodes()) {
      if (node.up && node.role == Role::kDecode)
        (void)send(from, control::PeerInfo{name, node.descriptor});
    }
  }
}

void RouterCore::on_prefill_ready(const std::string& from, control::PrefillReady& ready) {
  auto it = requests_.find(ready.request_id);
  if (it == requests_.end() || it->second.decode_node != from) {
    // Ended meanwhile: the decode node frees the reservation on abort.
    (void)send(from, control::Abort{ready.request_id, "the request already ended"});
    return;
  }
  Request& request = it->second;
  // Its prefill failed meanwhile: the decode node computes the prompt and
  // frees this reservation when it hears so.
  if (request.prefill_fell_back) return;
  control::Prefill prefill;
  prefill.request_id = request.id;
  prefill.prompt = request.request.prompt;
  prefill.sampling = request.request.sampling;
  prefill.decode_node = request.decode_node;
  prefill.transfer_id = ready.transfer_id;
  prefill.dst_blocks = std::move(ready.dst_blocks);
  prefill.cached_blocks = ready.cached_blocks;
  prefill.skipped_blocks = ready.skipped_blocks;
  prefill.client_id = request.request.client_id;
  kv_blocks_sent_ += prefill.dst_blocks.size();
  kv_blocks_cached_ += uint64_t(std::max(0, ready.cached_blocks));
  kv_blocks_skipped_ += uint64_t(std::max(0, ready.skipped_blocks));
  while (true) {
    NodeState* prefill_node = registry_.find(request.prefill_node);
    if (prefill_node == nullptr || !prefill_node->up) {
      return fail(request.id, unavailable("prefill node '" + request.prefill_node + "' is down"));
    }
    Status sent = send(request.prefill_node, prefill);
    if (sent.is_ok()) return;
    // Its connection is gone (it died before its heartbeats ran out). The
    // prefill never reached it, and the decode node takes the KV from
    // whichever node sends it: another prefill node can do it.
    const std::string dead = request.prefill_node;
    registry_.mark_down(dead);
    release_prefill(request);
    NodeState* other = registry_.pick(Role::kPrefill, request.request.prompt);
    if (other != nullptr) {
      request.prefill_node = other->name;
      request.prefilled_by = other->name;
      other->assigned_requests++;
      other->assigned_tokens += int64_t(request.request.prompt.size());
    } else {
      request.prefill_node = dead;  // failed with the node's other requests
    }
    node_down(dead, sent.message());  // fails the dead node's other requests
    if (other == nullptr) return;
  }
}

void RouterCore::on_prefill_done(const std::string& from, control::PrefillDone& done) {
  auto it = requests_.find(done.request_id);
  if (it == requests_.end() || it->second.prefill_node != from) return;
  Request& request = it->second;
  release_prefill(request);
  if (!done.error.empty()) {
    // The decode node may have seen the transfer fail first, and be
    // computing the prompt already.
    if (request.prefill_fell_back) return;
    const std::string why = "prefill on " + from + " failed: " + done.error;
    if (!fall_back_to_decode_node(request, why)) fail(request.id, unavailable(why));
    return;
  }
  if (Status within =
          check_node_logprobs(from, request.request.sampling, request.request.prompt.size(),
                              done.prompt_logprobs, done.first_logprobs, 1);
      !within.is_ok())
    return fail(request.id, within);
  request.queue_seconds = done.queue_seconds;
  request.prefill_seconds = done.prefill_seconds;
  request.cached_tokens = done.cached_tokens;
  request.prompt_logprobs = std::move(done.prompt_logprobs);  // the decode node needs none
  Status sent = send(request.decode_node, done);
  if (!sent.is_ok()) fail(request.id, sent);
}

void RouterCore::on_events(const std::string& from, control::Events& events) {
  for (control::TokenEvent& event : events.events) {
    auto it = requests_.find(event.request_id);
    if (it == requests_.end() || it->second.decode_node != from) {
      // Work the router no longer waits for: failed when this node was
      // declared dead (it was only stopped, and came back), or ended
      // meanwhile. Without an abort the node would generate it to the end.
      if (event.finish_reason == FinishReason::kNone) {
        (void)send(from, control::Abort{event.request_id, "the request already ended"});
      }
      continue;
    }
    Request& request = it->second;
    if (Status within =
            check_node_logprobs(from, request.request.sampling, request.request.prompt.size(),
                                event.prompt_logprobs, event.logprobs, event.tokens.size());
        !within.is_ok()) {
      fail(request.id, within);
      continue;
    }
    GenerationUpdate update;
    if (!request.got_tokens && !event.tokens.empty()) {
      // The node that computed the prompt timed it: this decode node, or
      // the prefill node (PrefillDone).
      const bool here = event.prefill_seconds >= 0;
      // A prompt sent to a prefill node and computed here after all: its
      // KV did not arrive whole, and the decode node fell back on its own.
      if (here && !request.prefilled_by.empty() && !request.prefill_fell_back) {
        request.prefill_fell_back = true;
        request.prefilled_by.clear();
        ++prefill_fallbacks_;
      }
      update.queue_seconds = here ? event.queue_seconds : request.queue_seconds;
      update.prefill_seconds = here ? event.prefill_seconds : request.prefill_seconds;
      update.cached_tokens = here ? event.cached_tokens : request.cached_tokens;
      update.prompt_logprobs = std::move(here ? event.prompt_logprobs : request.prompt_logprobs);
      request.got_tokens = true;
      release_local_prefill(request);
      group_leader_moved(request, /*ended=*/false);
    }
    update.tokens = std::move(event.tokens);
    update.logprobs = std::move(event.logprobs);
    update.finished = event.finish_reason != FinishReason::kNone;
    update.finish_reason = event.finish_reason;
    if (event.finish_reason == FinishReason::kError)
      update.error = unavailable(from + ": " + event.error);
    bool finished = update.finished;
    deliver(request, std::move(update));
    // An undeliverable request is forgotten once it has had its error
    // (end_undeliverable).
    if (finished && !request.undeliverable) forget(event.request_id);
  }
}

void RouterCore::on_rejected(const std::string& from, const control::Rejected& rejected) {
  spdlog::error("router: {} refused the router's '{}' message (request {}): {}", from,
                rejected.type, rejected.request_id, rejected.reason);
  auto it = requests_.find(rejected.request_id);
  if (it == requests_.end()) return;
  const Request& request = it->second;
  if (request.decode_node != from && request.prefill_node != from) return;
  // The router admits only what the codec accepts, so this is a version
  // mismatch or a bug: no other node would read the message either.
  fail(rejected.request_id, internal_error("node " + from + " refused the '" + rejected.type +
                                           "' message: " + rejected.reason));
}

void RouterCore::node_down(const std::string& name, const std::string& why) {
  spdlog::warn("router: node {} is down: {}", name, why);
  // Published before the clients hear of it: one that asks /health or
  // /v1/nodes on reading its error sees the node down.
  publish_snapshot();
  std::vector<uint64_t> affected;
  for (const auto& [id, request] : requests_) {
    if (request.decode_node == name || request.prefill_node == name) affected.push_back(id);
  }
  const std::string failed = "node " + name + " failed during the request: " + why;
  for (uint64_t id : affected) {
    Request& request = requests_.at(id);
    // Its prefill node died, its decode node lives: the prompt is computed there.
    if (request.decode_node != name) {
      // Aborted there should it come back (it may only have stopped).
      abort_on_node(name, id, failed);
      release_prefill(request);
      if (request.prefill_fell_back || fall_back_to_decode_node(request, failed)) continue;
    }
    fail(id, unavailable(failed));
  }
  if (NodeState* node = registry_.find(name)) {
    node->assigned_requests = 0;
    node->assigned_tokens = 0;
    ++node->times_down;
  }
  publish_snapshot();
}

bool RouterCore::fall_back_to_decode_node(Request& request, const std::string& why) {
  NodeState* decode = registry_.find(request.decode_node);
  if (request.got_tokens || request.undeliverable || decode == nullptr || !decode->up) return false;
  control::PrefillDone notice;
  notice.request_id = request.id;
  notice.error = why;
  if (!send(request.decode_node, notice).is_ok()) return false;
  spdlog::warn("router: request {} (#{}): {}; its decode node {} computes the prompt",
               request.request.client_id, request.id, why, request.decode_node);
  request.prefill_fell_back = true;
  request.prefilled_by.clear();
  request.local_prefill_tokens = int64_t(request.request.prompt.size());
  decode->assigned_tokens += request.local_prefill_tokens;
  ++prefill_fallbacks_;
  return true;
}

void RouterCore::fail(uint64_t request_id, Status error) {
  auto it = requests_.find(request_id);
  // An undeliverable request is aborted already and gets its error from
  // end_undeliverable().
  if (it == requests_.end() || it->second.undeliverable) return;
  spdlog::warn("router: request {} (#{}) failed: {}", it->second.request.client_id, request_id,
               error.message());
  abort_on_nodes(it->second, error.message());
  deliver(it->second, failed_update(std::move(error)));
  forget(request_id);
}

void RouterCore::abort_on_nodes(const Request& request, const std::string& reason) {
  for (const std::string& name : {request.decode_node, request.prefill_node})
    abort_on_node(name, request.id, reason);
}

void RouterCore::abort_on_node(const std::string& name, uint64_t request_id,
                               const std::string& reason) {
  // Enough for every request a node can hold at once.
  constexpr size_t kMaxOrphans = 1 << 16;
  if (name.empty()) return;
  NodeState* node = registry_.find(name);
  if (node == nullptr) return;
  if (node->up) {
    (void)send(name, control::Abort{request_id, reason});
    return;
  }
  std::deque<uint64_t>& orphans = orphans_[name];
  if (orphans.size() >= kMaxOrphans) orphans.pop_front();
  orphans.push_back(request_id);
}

void RouterCore::release_prefill(Request& request) {
  if (request.prefill_node.empty()) return;
  if (NodeState* node = registry_.find(request.prefill_node)) {
    node->assigned_requests = std::max(0, node->assigned_requests - 1);
    node->assigned_tokens =
        std::max<int64_t>(0, node->assigned_tokens - int64_t(request.request.prompt.size()));
  }
  request.prefill_node.clear();
}

void RouterCore::release_local_prefill(Request& request) {
  if (request.local_prefill_tokens == 0) return;
  if (NodeState* node = registry_.find(request.decode_node)) {
    node->assigned_tokens =
        std::max<int64_t>(0, node->assigned_tokens - request.local_prefill_tokens);
  }
  request.local_prefill_tokens = 0;
}

void RouterCore::forget(uint64_t request_id) {
  auto it = requests_.find(request_id);
  if (it == requests_.end()) return;
  group_leader_moved(it->second, /*ended=*/true);
  release_prefill(it->second);
  release_local_prefill(it->second);
  if (NodeState* node = registry_.find(it->second.decode_node)) {
    node->assigned_requests = std::max(0, node->assigned_requests - 1);
  }
  requests_.erase(it);
  in_flight_.fetch_sub(1);
}

void RouterCore::publish_snapshot() {
  auto published = std::make_shared<ClusterSnapshot>();
  ClusterSnapshot& snapshot = *published;
  for (const auto& [name, node] : registry_.nodes()) {
    snapshot.nodes.push_back(node);
    if (node.role == Role::kPrefill) ++snapshot.prefill_configured;
  }
  size_t held = 0;
  for (const auto& [group_id, group] : groups_) held += group.held.size();
  snapshot.requests_in_router = int32_t(requests_.size() + held);
  snapshot.prefill_up = registry_.up_count(Role::kPrefill);
  snapshot.decode_up = registry_.up_count(Role::kDecode);
  snapshot.control_messages_rejected = socket_->rejected();
  snapshot.kv_blocks_sent = kv_blocks_sent_;
  snapshot.kv_blocks_cached = kv_blocks_cached_;
  snapshot.kv_blocks_skipped = kv_blocks_skipped_;
  snapshot.prefill_fallbacks = prefill_fallbacks_;
  snapshot.placements = placements_;
  decode_up_.store(snapshot.decode_up);
  std::shared_ptr<const ClusterSnapshot> previous;  // freed outside the lock
  std::lock_guard lock(snapshot_mutex_);
  previous = std::exchange(snapshot_, std::move(published));
}

bool RouterCore::call_sink(const UpdateSink& sink, const GenerationUpdate& update) {
  // A front end's sink that throws (out of memory building a reply, a bug)
  // must not end this thread, which serves every request.
  try {
    sink(update);
    return true;
  } catch (const std::exception& e) {
    spdlog::error("router: a front end could not take a request's output: {}", e.what());
  } catch (...) {
    spdlog::error("router: a front end could not take a request's output");
  }
  return false;
}

void RouterCore::deliver(Request& request, GenerationUpdate update) {
  if (request.undeliverable) return;  // nothing but its error now
  update.decode_node = request.decode_node;
  update.prefill_node = request.prefilled_by;
  if (call_sink(request.sink, update) || update.finished) return;
  // The request cannot go on: its nodes let it go now, and the loop forgets
  // it once the caller is done with it (the front end gets one more try,
  // with an error).
  abort_on_nodes(request, "the router could not deliver its output");
  request.undeliverable = true;
  undeliverable_.push_back(request.id);
}

void RouterCore::end_undeliverable() {
  for (uint64_t id : std::exchange(undeliverable_, {})) {
    auto it = requests_.find(id);
    if (it == requests_.end()) continue;
    call_sink(it->second.sink,
              failed_update(internal_error("the router could not deliver the request's output")));
    forget(id);
  }
}

Status RouterCore::send(const std::string& node, const control::Message& message) {
  Status status = socket_->send(node, message);
  if (!status.is_ok()) {
    spdlog::warn("router: {} to {} not sent: {}", control::message_type(message), node,
                 status.message());
  }
  return status;
}

}  // namespace baton::router
