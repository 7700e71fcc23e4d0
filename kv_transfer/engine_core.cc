// kv_transfer/engine_core.cc — TransferEngine set-up, the progress thread,
// endpoints (connect, probe, tear down) and deadlines.
#include <poll.h>

#include <algorithm>
#include <cstdint>
#include <future>
#include <utility>

#include "common/logging.h"
#include "kv_transfer/engine_impl.h"
#include "kv_transfer/ucx_failure_policy.h"

namespace baton::kv_transfer {
namespace {

void op_callback(void* request, ucs_status_t status, void* user_data) {
  auto* op = static_cast<OpContext*>(user_data);
  op->engine->on_op_complete(op, status);
  ucp_request_free(request);
}

void endpoint_error_callback(void* arg, ucp_ep_h /*ep*/, ucs_status_t status) {
  auto* tag = static_cast<EndpointTag*>(arg);
  tag->engine->on_endpoint_error(tag, status);
}

ucs_status_t control_callback(void* arg, const void* header, size_t header_length, void* /*data*/,
                              size_t /*length*/, const ucp_am_recv_param_t* param) {
  ucp_ep_h reply = (param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) ? param->reply_ep : nullptr;
  return static_cast<TransferEngine::Impl*>(arg)->on_control(header, header_length, reply);
}

ucs_status_t data_callback(void* arg, const void* header, size_t header_length, void* data,
                           size_t length, const ucp_am_recv_param_t* param) {
  return static_cast<TransferEngine::Impl*>(arg)->on_data(header, header_length, data, length,
                                                          param);
}

}  // namespace

// ---- set-up -----------------------------------------------------------------

Status TransferEngine::Impl::init() {
  std::vector<std::pair<std::string, std::string>> env(config_.ucx_env.begin(),
                                                       config_.ucx_env.end());
  BATON_ASSIGN_OR_RETURN(UcpConfigPtr ucp_config, read_ucp_config(env));
  survive_transport_failures();

  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED;
  params.features = UCP_FEATURE_RMA | UCP_FEATURE_AM | UCP_FEATURE_TAG | UCP_FEATURE_WAKEUP;
  params.mt_workers_shared = 0;
  ucp_context_h context = nullptr;
  BATON_UCX(ucp_init(&params, ucp_config.get(), &context));
  context_.reset(context);

  ucp_worker_params_t worker_params{};
  worker_params.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  worker_params.thread_mode = UCS_THREAD_MODE_SINGLE;
  ucp_worker_h worker = nullptr;
  BATON_UCX(ucp_worker_create(context_.get(), &worker_params, &worker));
  worker_.reset(worker);
  BATON_UCX(ucp_worker_get_efd(worker_.get(), &event_fd_));

  ucp_mem_map_params_t map{};
  map.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH |
                   UCP_MEM_MAP_PARAM_FIELD_FLAGS;
  map.address = pool_;
  map.length = pool_bytes_;
  // No pool given (or a staged pool's slots): UCX allocates it, from shared
  // memory first (its ALLOC_PRIO), so a peer on this host can map it and put
  // into it with plain stores.
  map.flags = pool_ == nullptr ? UCP_MEM_MAP_ALLOCATE : 0;
  ucp_mem_h mem = nullptr;
  BATON_UCX(ucp_mem_map(context_.get(), &map, &mem));
  registration_ = MemRegistration(context_.get(), mem);
  if (pool_ == nullptr) {
    ucp_mem_attr_t attr{};
    attr.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS | UCP_MEM_ATTR_FIELD_LENGTH;
    BATON_UCX(ucp_mem_query(mem, &attr));
    if (attr.length < pool_bytes_) {
      return internal_error("kv_transfer: UCX allocated " + std::to_string(attr.length) +
                            " bytes for a pool of " + std::to_string(pool_bytes_));
    }
    pool_ = static_cast<uint8_t*>(attr.address);
    spdlog::info("kv_transfer[{}]: {} of {} MiB allocated by UCX", config_.node_name,
                 staging_ != nullptr ? "host slots staging the KV pool" : "KV pool",
                 pool_bytes_ >> 20);
  }

  BATON_RETURN_IF_ERROR(init_staging());

  void* rkey_buffer = nullptr;
  size_t rkey_size = 0;
  BATON_UCX(ucp_rkey_pack(context_.get(), mem, &rkey_buffer, &rkey_size));
  RkeyBufferPtr rkey_owner(rkey_buffer);

  ucp_address_t* address = nullptr;
  size_t address_length = 0;
  BATON_UCX(ucp_worker_get_address(worker_.get(), &address, &address_length));
  WorkerAddress worker_address(worker_.get(), address, address_length);

  PoolDescriptor d;
  d.worker_address = worker_address.bytes();
  d.pool_base = reinterpret_cast<uint64_t>(pool_);
  d.pool_bytes = pool_bytes_;
  auto* rk = static_cast<const uint8_t*>(rkey_buffer);
  d.rkey.assign(rk, rk + rkey_size);
  d.layout = layout_;
  // A staged pool is copied in layer by layer as each is verified, which
  // needs the layers' hashes from its senders.
  if (staging_ != nullptr && config_.verify_checksum) d.flags |= kPoolFlagStaged;
  descriptor_bytes_ = encode_descriptor(d);

  for (auto [id, cb] : {std::pair{kAmControl, &control_callback}, {kAmData, &data_callback}}) {
    ucp_am_handler_param_t handler{};
    handler.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
                         UCP_AM_HANDLER_PARAM_FIELD_ARG | UCP_AM_HANDLER_PARAM_FIELD_FLAGS;
    handler.id = id;
    handler.cb = cb;
    handler.arg = this;
    handler.flags = UCP_AM_FLAG_WHOLE_MSG;
    BATON_UCX(ucp_worker_set_am_recv_handler(worker_.get(), &handler));
  }

  transports_ = context_transports(context_.get());
  registering_domains_ = domains_registering_host_memory();
  std::string list, domains;
  for (const auto& t : transports_) list += (list.empty() ? "" : " ") + t;
  for (const auto& d : registering_domains_) domains += (domains.empty() ? "" : " ") + d;
  spdlog::info(
      "kv_transfer[{}]: UCX {} transports: {}; domains registering user memory: {}; pool {} "
      "bytes registered; mode {}",
      config_.node_name, ucp_get_version_string(), list, domains, pool_bytes_,
      transfer_mode_name(config_.mode));

  thread_ = std::thread([this] { run(); });
  return Status::ok();
}

TransferEngine::Impl::~Impl() {
  if (thread_.joinable()) {
    stopping_ = true;
    ucp_worker_signal(worker_.get());
    thread_.join();
  }
}

Status TransferEngine::Impl::check_transfer(
    uint64_t transfer_id, int32_t layer_begin, int32_t& layer_end,
    const std::optional<std::chrono::milliseconds>& deadline) const {
  if (transfer_id > kMaxTransferId) {
    return out_of_range("transfer id " + std::to_string(transfer_id) + " over 32 bits");
  }
  if (layer_end < 0) layer_end = layout_.num_layers;
  if (layer_begin < 0 || layer_begin >= layer_end || layer_end > layout_.num_layers) {
    return out_of_range("layer range [" + std::to_string(layer_begin) + ", " +
                        std::to_string(layer_end) + ") of transfer " + std::to_string(transfer_id) +
                        " outside the pool");
  }
  if (deadline) {
    BATON_RETURN_IF_ERROR(
        check_duration(*deadline, "deadline of transfer " + std::to_string(transfer_id)));
  }
  return Status::ok();
}

// ---- the progress loop -------------------------------------------------------

void TransferEngine::Impl::enqueue(std::function<void()> command) {
  {
    std::lock_guard lock(api_mutex_);
    commands_.push_back(std::move(command));
    has_commands_ = true;
  }
  ucp_worker_signal(worker_.get());
}

std::vector<std::function<void()>> TransferEngine::Impl::take_commands() {
  std::lock_guard lock(api_mutex_);
  return std::exchange(commands_, {});
}

void TransferEngine::Impl::enqueue_and_wait(std::function<void()> command, uint64_t transfer_id,
                                            const char* what) {
  auto ran = std::make_shared<std::promise<void>>();
  std::future<void> done = ran->get_future();
  enqueue([ran, command = std::move(command)] {
    command();
    ran->set_value();
  });
  // The progress thread itself (inside a callback) cannot wait for its own
  // queue: the command runs before the worker is next progressed. Elsewhere
  // the wait is bounded; past it the command still runs.
  if (std::this_thread::get_id() != thread_.get_id() &&
      done.wait_for(config_.close_timeout) != std::future_status::ready) {
    spdlog::warn("kv_transfer[{}]: {} of transfer {} not yet in effect after {} ms",
                 config_.node_name, what, transfer_id, config_.close_timeout.count());
  }
}

bool TransferEngine::Impl::busy() const {
  // A send waiting for its next layer, its grant or its verdict is not
  // busy: the compute thread's command or the peer's message wakes the
  // worker. Spinning through a prompt's prefill would take a core from the
  // compute beside it.
  for (const auto& [id, t] : sends_) {
    if (t.outstanding > 0) return true;
  }
  for (const auto& [id, e] : expectations_) {
    if (e.outstanding > 0) return true;
  }
  return false;
}

void TransferEngine::Impl::run() {
  constexpr int kProgressBurst = 64;
  // Busy polling must stay cheap: while work flows, the clock is read only
  // every few hundred spins (deadlines are milliseconds apart).
  constexpr int kSpinsPerDeadlineCheck = 256;
  // Idle, the worker polls this long before it sleeps: a peer's answer (a
  // grant, an ack) or the compute's next layer often follows within
  // microseconds, sooner than a wake from poll(). Longer would take more of
  // a core from the compute each time a layer is handed over.
  constexpr auto kLinger = std::chrono::microseconds(500);
  int spins = 0;
  Clock::time_point idle_since = Clock::time_point::max();  // max: working
  while (!stopping_) {
    std::vector<std::function<void()>> commands;
    if (has_commands_.exchange(false)) commands = take_commands();
    for (auto& command : commands) command();
    int progressed = 0;
    while (progressed < kProgressBurst && ucp_worker_progress(worker_.get()) != 0) ++progressed;
    progressed += receive_tagged();
    process_events();
    bool hashed = hash_slice();
    const bool working = progressed > 0 || hashed || !commands.empty() || busy();
    if (working) idle_since = Clock::time_point::max();
    if (working && ++spins < kSpinsPerDeadlineCheck) continue;
    const Clock::time_point now = Clock::now();
    if (!working && idle_since == Clock::time_point::max()) idle_since = now;
    const bool lingering = !working && now - idle_since < kLinger;
    if (lingering && ++spins < kSpinsPerDeadlineCheck) continue;
    spins = 0;
    check_deadlines(now);
    if (!working && !lingering) wait_for_events(now);
  }
  shutdown();
}

void TransferEngine::Impl::wait_for_events(Clock::time_point now) {
  ucs_status_t status = ucp_worker_arm(worker_.get());
  if (status == UCS_ERR_BUSY) return;  // events already pending
  if (status != UCS_OK) {
    spdlog::warn("kv_transfer[{}]: ucp_worker_arm failed: {}", config_.node_name,
                 ucs_status_string(status));
  }
  // Sleep until an event or the next timer; an expectation waiting for the
  // sender's word (kPutsStopped) is woken by the message, not by spinning.
  auto wait = config_.idle_wait;
  for (const auto& [id, e] : expectations_) {
    const Clock::time_point at = e.next_timer(config_.close_timeout);
    if (at == Clock::time_point::max()) continue;
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(at - now);
    wait = std::clamp(left + std::chrono::milliseconds(1), std::chrono::milliseconds(0), wait);
  }
  pollfd fd{event_fd_, POLLIN, 0};
  poll(&fd, 1, int(wait.count()));
}

void TransferEngine::Impl::process_events() {
  if (copy_in_ != nullptr) collect_copied_in();
  // Connections and endpoint failures first: they decide what transfers can do.
  while (!connected_.empty() || !failed_endpoints_.empty() || !dirty_sends_.empty() ||
         !dirty_recvs_.empty() || !granted_sends_.empty() || !landed_layers_.empty() ||
         !flushed_layers_.empty()) {
    auto connected = std::move(connected_);
    connected_.clear();
    for (auto [peer, generation, status] : connected) on_connected(peer, generation, status);
    auto failed = std::move(failed_endpoints_);
    failed_endpoints_.clear();
    for (auto [peer, generation, status] : failed) {
      if (peer < peers_.size() && peers_[peer].generation == generation &&
          peers_[peer].phase != PeerState::Phase::kIdle) {
        tear_down(peer, Status(ucx_status_code(status),
                               std::string("peer endpoint failed: ") + ucs_status_string(status)));
      }
    }
    auto granted = std::move(granted_sends_);
    granted_sends_.clear();
    for (uint64_t id : granted) {
      if (auto it = sends_.find(id); it != sends_.end()) pump(it->second, id);
    }
    auto landed = std::move(landed_layers_);
    landed_layers_.clear();
    for (const Notice& n : landed) hash_announced_layer(n);
    auto flushed = std::move(flushed_layers_);
    flushed_layers_.clear();
    for (const auto& [id, layer] : flushed) announce_layer_hash(id, layer);
    auto sends = std::move(dirty_sends_);
    dirty_sends_.clear();
    for (uint64_t id : sends) maybe_finish_send(id);
    auto recvs = std::move(dirty_recvs_);
    dirty_recvs_.clear();
    for (uint64_t id : recvs) maybe_finish_recv(id);
  }
}

void TransferEngine::Impl::check_deadlines(Clock::time_point now) {
  std::vector<PeerId> expired_peers;
  for (auto& [id, t] : sends_) {
    if ((!t.failed() || t.outstanding > 0) && now > t.deadline && t.awaiting_slots) {
      // Still waiting for staging slots: nothing of it reached the peer,
      // which is not to blame.
      t.fail(deadline_exceeded("transfer " + std::to_string(id) +
                               " waited past its deadline for staging slots "
                               "(transfer.staging_blocks)"));
      dirty_sends_.push_back(id);
      continue;
    }
    // A failed (or cancelled) transfer still waiting for its operations past
    // the deadline is stuck on the same peer as one that missed it; one
    // waiting for its own producer's next layers fails alone.
    if ((!t.failed() || t.outstanding > 0) && now > t.deadline) {
      const bool producer = !t.failed() && t.waits_for_producer();
      t.fail(deadline_exceeded(
          "transfer " + std::to_string(id) +
          (producer ? " waited past its deadline for its next layers" : " missed its deadline")));
      if (!producer) expired_peers.push_back(t.peer);
      dirty_sends_.push_back(id);
    }
  }
  // A peer that let a transfer expire is presumed broken: its endpoint goes,
  // which also cancels whatever of ours is still in flight on it.
  for (PeerId peer : expired_peers) {
    if (peers_[peer].phase != PeerState::Phase::kIdle) {
      tear_down(peer, deadline_exceeded("peer did not complete a transfer in time"));
    }
  }
  for (auto& [id, e] : expectations_) {
    if (e.failed() && e.outstanding > 0 && now > e.abandon_after) {
      // Receives from a sender that vanished on a transport without failure
      // detection: nothing can fetch from a dead process any more.
      spdlog::warn("kv_transfer[{}]: abandoning {} receives of {} transfer {}", config_.node_name,
                   e.outstanding, e.cancelled() ? "cancelled" : "expired", id);
      e.write_off_ops();
      dirty_recvs_.push_back(id);
    }
    if (e.awaits_puts_stopped() &&
        now > std::min(e.abandon_after, e.last_grant + config_.close_timeout)) {
      // Puts granted before the failure have had close_timeout to land, and
      // later ones would need a grant it no longer gives.
      spdlog::warn(
          "kv_transfer[{}]: the sender of {} transfer {} never reported its puts "
          "stopped; releasing its blocks",
          config_.node_name, e.cancelled() ? "cancelled" : "failed", id);
      e.puts_stopped = true;
      dirty_recvs_.push_back(id);
    }
    if (e.open() && now > e.deadline) {
      e.fail(deadline_exceeded("expected transfer " + std::to_string(id) +
                               " did not complete in time"));
      dirty_recvs_.push_back(id);
    }
  }
  process_events();
}

void TransferEngine::Impl::shutdown() {
  // Copies out of the pool finish (the callbacks below free their blocks).
  if (copy_out_ != nullptr) copy_out_->stop();
  // Commands the loop had not taken yet (a send just begun, an expectation,
  // a copy's hand-over) run now: every transfer they make is failed and
  // reported below; dropped, a send begun just before the stop would never
  // call back.
  for (auto commands = take_commands(); !commands.empty(); commands = take_commands())
    for (auto& command : commands) command();
  if (copy_in_ != nullptr) {
    // Copies into the pool finish first (their blocks are being written), and
    // their verdicts are recorded before everything else fails.
    copy_in_->stop();
    collect_copied_in();
  }
  hash_jobs_.clear();  // every transfer fails below: no verdict or notice needs them
  for (auto& [id, t] : sends_) {
    t.fail(Status(StatusCode::kAborted, "transfer engine stopped"));
  }
  for (auto& [id, e] : expectations_) {
    e.fail(Status(StatusCode::kAborted, "transfer engine stopped"));
  }
  for (PeerId p = 0; p < peers_.size(); ++p) {
    if (peers_[p].phase != PeerState::Phase::kIdle) {
      tear_down(p, Status(StatusCode::kAborted, "transfer engine stopped"));
    }
  }
  // Whatever UCX still holds completes within the bound, and senders granted
  // puts have that long to say theirs stopped; then report.
  auto awaiting_puts = [&] {
    return std::any_of(expectations_.begin(), expectations_.end(),
                       [&](const auto& entry) { return entry.second.awaits_puts_stopped(); });
  };
  auto until = Clock::now() + config_.close_timeout;
  auto discarding = [&] { return tagged_discards_in_flight_ > 0 || !pending_discards_.empty(); };
  while (Clock::now() < until && (busy() || awaiting_puts() || discarding())) {
    ucp_worker_progress(worker_.get());
    drain_discards();
    for (auto& [id, t] : sends_) dirty_sends_.push_back(id);
    for (auto& [id, e] : expectations_) dirty_recvs_.push_back(id);
    process_events();
  }
  // The pool goes with this engine: every transfer is reported regardless,
  // its operations still in UCX written off.
  for (auto& [id, e] : expectations_) {
    e.puts_stopped = true;
    if (e.outstanding > 0) e.write_off_ops();
    dirty_recvs_.push_back(id);
  }
  for (auto& [id, t] : sends_) {
    if (t.outstanding > 0) {
      spdlog::error("kv_transfer[{}]: transfer {} still has UCX operations at shutdown",
                    config_.node_name, id);
      t.write_off_ops();
    }
    dirty_sends_.push_back(id);
  }
  process_events();
}

// ---- endpoints ---------------------------------------------------------------

ucs_status_ptr_t TransferEngine::Impl::post_op(OpContext* op, ucs_status_ptr_t request) {
  if (request == nullptr || UCS_PTR_IS_ERR(request)) delete op;
  return request;
}

void TransferEngine::Impl::connect(PeerId id) {
  PeerState& peer = peers_[id];
  if (peer.phase != PeerState::Phase::kIdle) return;
  ++peer.generation;
  endpoint_tags_.push_back(EndpointTag{this, id, peer.generation});
  ucp_ep_params_t params{};
  params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                      UCP_EP_PARAM_FIELD_ERR_HANDLER;
  params.address = reinterpret_cast<const ucp_address_t*>(peer.descriptor.worker_address.data());
  params.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  params.err_handler.cb = endpoint_error_callback;
  params.err_handler.arg = &endpoint_tags_.back();
  ucs_status_t status = UCS_ERR_UNREACHABLE;
  if (!config_.peer_error_handling) peer.no_failure_detection = true;
  if (!peer.no_failure_detection) status = ucp_ep_create(worker_.get(), &params, &peer.ep);
  if (status == UCS_ERR_UNREACHABLE) {
    // UCX 1.13's shared-memory transports cannot detect a dead peer, so UCX
    // refuses PEER error handling over them. Fall back to none: deadlines and
    // the receiver's ack still bound every transfer. (A refused TCP connection
    // is also "unreachable", and fails again below.)
    params.field_mask &= ~uint64_t(UCP_EP_PARAM_FIELD_ERR_HANDLER);
    params.err_mode = UCP_ERR_HANDLING_MODE_NONE;
    status = ucp_ep_create(worker_.get(), &params, &peer.ep);
    if (status == UCS_OK && !peer.no_failure_detection && config_.peer_error_handling) {
      spdlog::warn(
          "kv_transfer[{}]: transports to peer {} offer no peer-failure detection; "
          "relying on deadlines and acks",
          config_.node_name, id);
      peer.no_failure_detection = true;  // no second try: UCX logs each refusal
    }
  }
  if (status != UCS_OK) {
    peer.ep = nullptr;
    connected_.emplace_back(id, peer.generation, status);
    peer.phase = PeerState::Phase::kConnecting;
    return;
  }
  peer.phase = PeerState::Phase::kConnecting;
  // A flush completes once wire-up has settled the endpoint's lanes; only then
  // does the lane table say what UCX will really use.
  auto* op = new OpContext{this, 0, OpContext::kConnect, id, peer.generation};
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  param.cb.send = op_callback;
  param.user_data = op;
  ucs_status_ptr_t request = post_op(op, ucp_ep_flush_nbx(peer.ep, &param));
  if (request == nullptr || UCS_PTR_IS_ERR(request)) {
    connected_.emplace_back(id, peer.generation, UCS_PTR_STATUS(request));
  }
}

void TransferEngine::Impl::on_connected(PeerId id, uint64_t generation, ucs_status_t status) {
  PeerState& peer = peers_[id];
  if (peer.generation != generation || peer.phase != PeerState::Phase::kConnecting) return;
  if (status != UCS_OK) {
    tear_down(id, Status(ucx_status_code(status),
                         std::string("connecting to peer failed: ") + ucs_status_string(status)));
    return;
  }
  peer.caps = probe_endpoint(peer.ep, registering_domains_);
  ucp_rkey_h rkey = nullptr;
  ucs_status_t unpack = ucp_ep_rkey_unpack(peer.ep, peer.descriptor.rkey.data(), &rkey);
  if (unpack == UCS_OK) peer.rkey.reset(rkey);
  void* mapped = nullptr;
  if (peer.rkey != nullptr &&
      ucp_rkey_ptr(peer.rkey.get(), peer.descriptor.pool_base, &mapped) == UCS_OK) {
    peer.mapped_pool = static_cast<uint8_t*>(mapped);
  }
  bool rma =
      config_.mode == TransferMode::kRma || (config_.mode == TransferMode::kAuto &&
                                             (peer.caps.native_rma || peer.mapped_pool != nullptr));
  if (rma && peer.rkey == nullptr) {
    tear_down(id, ucx_error("ucp_ep_rkey_unpack", unpack, __FILE__, __LINE__));
    return;
  }
  peer.mode = rma                                 ? TransferMode::kRma
              : config_.mode == TransferMode::kAm ? TransferMode::kAm
                                                  : TransferMode::kTag;
  peer.mover = make_byte_mover(peer.mode, peer.ep, peer.descriptor, peer.rkey.get(),
                               peer.mode == TransferMode::kRma ? peer.mapped_pool : nullptr);
  peer.phase = PeerState::Phase::kReady;
  std::string lanes;
  for (const auto& t : peer.caps.transports) lanes += (lanes.empty() ? "" : " ") + t;
  std::string rma_domains;
  for (const auto& d : peer.caps.rma_domains) rma_domains += (rma_domains.empty() ? "" : " ") + d;
  const char* rma_kind = peer.caps.native_rma          ? "native"
                         : peer.mapped_pool != nullptr ? "peer pool mapped"
                                                       : "emulated";
  spdlog::info(
      "kv_transfer[{}]: peer {} connected over {}; RMA lanes on [{}]: {} RMA; transfers use {}",
      config_.node_name, id, lanes, rma_domains, rma_kind, transfer_mode_name(peer.mode));
  {
    std::lock_guard lock(api_mutex_);
    peer_paths_[id] = std::string(transfer_mode_name(peer.mode)) +
                      (peer.mode == TransferMode::kRma ? std::string(" (") + rma_kind + ")" : "") +
                      " over " + lanes;
  }
  spdlog::debug("kv_transfer[{}]: peer {} lanes:\n{}", config_.node_name, id, peer.caps.lane_table);
  // UCX can abort this process when the peer dies mid-transfer in these two
  // forced modes (1.13: an assertion in AM rendezvous; 1.13 and 1.22:
  // `ucs_fatal` in emulated puts); neither passes through the log handler
  // of ucx_failure_policy.h.
  const bool emulated_puts =
      peer.mode == TransferMode::kRma && !peer.caps.native_rma && peer.mapped_pool == nullptr;
  if (peer.mode == TransferMode::kAm || emulated_puts) {
    spdlog::warn(
        "kv_transfer[{}]: peer {}: mode '{}'{} is not safe against a peer dying mid-transfer "
        "(UCX can abort this process); mode 'auto' is",
        config_.node_name, id, transfer_mode_name(peer.mode),
        emulated_puts ? " over emulated RMA" : "");
  }
  auto waiting = std::move(peer.waiting);
  peer.waiting.clear();
  for (uint64_t t : waiting) {
    auto it = sends_.find(t);
    if (it != sends_.end()) pump(it->second, t);
  }
}

void TransferEngine::Impl::tear_down(PeerId id, const Status& why) {
  PeerState& peer = peers_[id];
  const auto failing = std::ranges::count_if(
      sends_, [&](const auto& entry) { return entry.second.peer == id && !entry.second.failed(); });
  if (why.code() == StatusCode::kAborted) {  // our own shutdown
    spdlog::debug("kv_transfer[{}]: closing endpoint to peer {}", config_.node_name, id);
  } else if (failing == 0) {
    // A peer that stops or restarts with no send in flight to it (a
    // cluster shutting down) costs nothing.
    spdlog::info("kv_transfer[{}]: closing endpoint to peer {}, no send in flight to it: {}",
                 config_.node_name, id, why.to_string());
  } else {
    spdlog::warn("kv_transfer[{}]: tearing down endpoint to peer {}, failing {} send{}: {}",
                 config_.node_name, id, failing, failing == 1 ? "" : "s", why.to_string());
  }
  counters_.torn_down++;
  // Fail this peer's transfers first, so completions arriving from the forced
  // close find them already failed.
  for (auto& [tid, t] : sends_) {
    if (t.peer == id) {
      t.fail(why);
      dirty_sends_.push_back(tid);
    }
  }
  peer.waiting.clear();
  peer.mover.reset();          // it holds the endpoint and the rkey
  peer.mapped_pool = nullptr;  // unmapped with the rkey
  peer.rkey.reset();           // rkeys go before their endpoint
  ucp_ep_h ep = std::exchange(peer.ep, nullptr);
  peer.phase = PeerState::Phase::kIdle;
  ++peer.generation;  // callbacks of the old endpoint no longer match
  {
    std::lock_guard lock(api_mutex_);
    if (id < peer_paths_.size()) peer_paths_[id].clear();
  }
  // A notice's kept reply endpoint may be the one closed here: UCX can
  // answer a peer on our own endpoint to it (over TCP an ack sent after this
  // close crashed, SenderDiesWhileItsTransferIsCopiedIn). That ack is not
  // sent; the peer gets none, as from a receiver that died. Forgotten before
  // the close and again after it: the close progresses the worker, and a
  // notice handled meanwhile may keep the same endpoint.
  auto forget_reply_eps = [&] {
    if (ep == nullptr) return;
    for (auto& [tid, e] : expectations_) {
      if (e.reply_ep() == ep) e.forget_reply_ep();
    }
  };
  forget_reply_eps();
  Status closed = close_endpoint(worker_.get(), ep, /*force=*/true, config_.close_timeout);
  forget_reply_eps();
  if (!closed.is_ok()) {
    spdlog::warn("kv_transfer[{}]: {}", config_.node_name, closed.to_string());
  }
  // With peer error handling a forced close completes every request. Without
  // it (shared memory in UCX 1.13) requests to a dead peer may stay pending
  // forever; they can only read our source blocks on behalf of a peer we have
  // given up on, so the transfer is abandoned and its late callbacks ignored.
  for (auto& [tid, t] : sends_) {
    if (t.peer == id && t.outstanding > 0) {
      spdlog::warn("kv_transfer[{}]: abandoning {} UCX operations of transfer {} to peer {}",
                   config_.node_name, t.outstanding, tid, id);
      t.write_off_ops();
      dirty_sends_.push_back(tid);
    }
  }
}

void TransferEngine::Impl::on_endpoint_error(EndpointTag* tag, ucs_status_t status) {
  failed_endpoints_.emplace_back(tag->peer, tag->generation, status);
}

void TransferEngine::Impl::on_op_complete(OpContext* op, ucs_status_t status) {
  switch (op->kind) {
    case OpContext::kConnect:
      connected_.emplace_back(op->peer, op->generation, status);
      break;
    case OpContext::kSendData:
    case OpContext::kFlush:
    case OpContext::kLayerFlush:
    case OpContext::kNotice: {
      auto it = sends_.find(op->transfer_id);
      if (it != sends_.end() && it->second.serial == op->serial &&
          it->second.op_epoch == op->epoch) {
        SendTransfer& t = it->second;
        --t.outstanding;
        if (status != UCS_OK && status != UCS_ERR_CANCELED) {
          // The endpoint is broken (also where UCX calls no error handler):
          // tear it down, the next transfer builds a fresh one.
          failed_endpoints_.emplace_back(op->peer, op->generation, status);
        }
        if (status != UCS_OK) {
          t.fail(Status(ucx_status_code(status),
                        std::string("UCX operation failed: ") + ucs_status_string(status)));
        }
        if (op->kind == OpContext::kFlush && status == UCS_OK) t.flush_completed();
        if (op->kind == OpContext::kLayerFlush && status == UCS_OK) {
          t.layer_flushed[size_t(op->layer - t.spec.layer_begin)] = true;
          flushed_layers_.emplace_back(op->transfer_id, op->layer);  // announced by the loop
        }
        dirty_sends_.push_back(op->transfer_id);
      }
      break;
    }
    case OpContext::kRecvData: {
      auto it = expectations_.find(op->transfer_id);
      if (it != expectations_.end() && it->second.serial == op->serial &&
          it->second.op_epoch == op->epoch) {
        Expectation& e = it->second;
        --e.outstanding;
        if (status == UCS_OK) {
          e.received_bytes += op->bytes;
          hash_landed(e, op->layer, op->first_block, op->block_count, /*now=*/false);
        } else {
          e.fail(Status(ucx_status_code(status),
                        std::string("receiving KV data failed: ") + ucs_status_string(status)));
        }
        dirty_recvs_.push_back(op->transfer_id);
      }
      break;
    }
    case OpContext::kDiscardTag:  // the next waits in drain_discards
      --tagged_discards_in_flight_;
      [[fallthrough]];
    case OpContext::kDiscard:  // its scratch goes with the op
      discard_scratch_changed(-int64_t(op->header.size()));
      break;
    case OpContext::kAck:
      break;
  }
  delete op;
}

// ---- public API --------------------------------------------------------------

Result<PeerId> TransferEngine::Impl::add_peer(std::span<const uint8_t> bytes) {
  BATON_ASSIGN_OR_RETURN(PoolDescriptor d, decode_descriptor(bytes));
  if (d.layout.dtype != layout_.dtype) {
    return invalid_argument("peer pool keeps KV as " + std::string(dtype_name(d.layout.dtype)) +
                            ", this one as " + std::string(dtype_name(layout_.dtype)) +
                            ": set the same engine.kv_dtype on prefill and decode nodes");
  }
  if (!d.layout.same_geometry(layout_)) {
    return invalid_argument("peer pool has a different KV geometry (" +
                            geometry_difference(d.layout, layout_) + ", the peer's first)");
  }
  PeerId id;
  {
    std::lock_guard lock(api_mutex_);
    id = PeerId(peer_layouts_.size());
    peer_layouts_.push_back(d.layout);
    peer_removed_.push_back(false);
    peer_paths_.emplace_back();
  }
  enqueue([this, id, d = std::move(d)]() mutable {
    peers_.emplace_back();
    peers_.back().descriptor = std::move(d);
    // Wire the endpoint up now, not at the first transfer: UCX 1.13 aborts
    // the process (an assertion in ucp_request_send_state_ff, removed in
    // 1.14) when a peer dies while the wire-up reply to it is pending, which
    // a prefill node killed during its first transfer to a decode node made
    // happen. A peer that cannot be reached is torn down as on any use.
    connect(id);
  });
  return id;
}

void TransferEngine::Impl::remove_peer(PeerId id) {
  {
    std::lock_guard lock(api_mutex_);
    if (id >= peer_removed_.size() || peer_removed_[id]) return;
    peer_removed_[id] = true;
  }
  enqueue([this, id] {
    if (id < peers_.size()) tear_down(id, Status(StatusCode::kAborted, "peer replaced"));
  });
}

EngineStats TransferEngine::Impl::stats() const {
  EngineStats s;
  s.sends_ok = counters_.sends_ok;
  s.sends_failed = counters_.sends_failed;
  s.receives_ok = counters_.receives_ok;
  s.receives_failed = counters_.receives_failed;
  s.ops_posted = counters_.ops_posted;
  s.bytes_sent = counters_.bytes_sent;
  s.notices_rejected = counters_.notices_rejected;
  s.data_rejected = counters_.data_rejected;
  s.endpoints_torn_down = counters_.torn_down;
  s.sends_waited_for_slots = counters_.sends_waited_for_slots;
  s.discard_scratch_peak_bytes = counters_.discard_scratch_peak;
  return s;
}

Result<std::unique_ptr<TransferEngine>> TransferEngine::create(
    const TransferConfig& config, const KvLayout& layout, void* pool, size_t pool_bytes,
    std::unique_ptr<PoolCopier> staging) {
  BATON_RETURN_IF_ERROR(validate(config));
  if (pool_bytes != layout.total_bytes() || layout.num_blocks <= 0 || layout.num_layers <= 0) {
    return invalid_argument("kv_transfer: pool size does not match its KV layout");
  }
  if (layout.num_layers > kMaxLayers || layout.num_blocks > kMaxBlocks) {
    return out_of_range("kv_transfer: at most 256 layers and 2^24 blocks per pool");
  }
  if (staging != nullptr && pool == nullptr) {
    return invalid_argument("kv_transfer: a staged pool must be given (it is not allocated)");
  }
  if (config.staging_blocks > kMaxBlocks) {
    return out_of_range("kv_transfer: staging_blocks " + std::to_string(config.staging_blocks) +
                        " over the 2^24 blocks a transfer can name");
  }
  auto impl = std::make_unique<Impl>(config, layout, static_cast<uint8_t*>(pool), pool_bytes,
                                     std::move(staging));
  BATON_RETURN_IF_ERROR(impl->init().with_context("starting the KV transfer engine"));
  return std::unique_ptr<TransferEngine>(new TransferEngine(std::move(impl)));
}

TransferEngine::TransferEngine(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
TransferEngine::~TransferEngine() = default;

const std::vector<uint8_t>& TransferEngine::descriptor() const { return impl_->descriptor_bytes_; }
void* TransferEngine::pool() const {
  return impl_->staged_pool_ != nullptr ? impl_->staged_pool_ : impl_->pool_;
}
Result<PeerId> TransferEngine::add_peer(std::span<const uint8_t> d) { return impl_->add_peer(d); }
void TransferEngine::remove_peer(PeerId id) { impl_->remove_peer(id); }
Status TransferEngine::begin_send(PeerId peer, SendSpec spec, TransferCallback on_done) {
  return impl_->begin_send(peer, std::move(spec), std::move(on_done), /*all_posted=*/false);
}
Status TransferEngine::post_layers(uint64_t transfer_id, int32_t layer_end) {
  return impl_->post_layers(transfer_id, layer_end);
}
Status TransferEngine::write_blocks(PeerId peer, SendSpec spec, TransferCallback on_done) {
  return impl_->begin_send(peer, std::move(spec), std::move(on_done), /*all_posted=*/true);
}
Status TransferEngine::expect(RecvSpec spec, TransferCallback on_done,
                              std::vector<int32_t>* wire_blocks) {
  return impl_->expect(std::move(spec), std::move(on_done), wire_blocks);
}
int32_t TransferEngine::staging_slots() const {
  return impl_->staged_pool_ != nullptr ? impl_->layout_.num_blocks : 0;
}
int32_t TransferEngine::staging_slots_free() const { return impl_->staging_slots_free(); }
Status TransferEngine::cancel_expect(uint64_t transfer_id) {
  return impl_->cancel_expect(transfer_id);
}
Status TransferEngine::cancel_send(uint64_t transfer_id) { return impl_->cancel_send(transfer_id); }
Status TransferEngine::send_control_bytes(PeerId peer, std::vector<uint8_t> bytes) {
  return impl_->send_control_bytes(peer, std::move(bytes));
}
EngineStats TransferEngine::stats() const { return impl_->stats(); }
std::vector<std::string> TransferEngine::transports() const { return impl_->transports_; }

const std::string& TransferEngine::staging() const { return impl_->staging_path_; }

std::string TransferEngine::peer_path(PeerId peer) const { return impl_->peer_path(peer); }

int32_t TransferEngine::Impl::staging_slots_free() const {
  if (staging_ == nullptr) return INT32_MAX;
  std::lock_guard lock(api_mutex_);
  return slots_.free();
}

std::string TransferEngine::Impl::peer_path(PeerId peer) const {
  std::lock_guard lock(api_mutex_);
  return peer < peer_paths_.size() ? peer_paths_[peer] : std::string();
}

}  // namespace baton::kv_transfer
