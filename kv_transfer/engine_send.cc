// kv_transfer/engine_send.cc — the sender: merged runs per layer as RMA puts
// or AM rendezvous, flush, completion notice, ack.

#include "common/logging.h"
#include "kv_transfer/engine_impl.h"

namespace baton::kv_transfer {
namespace {

void send_callback(void* request, ucs_status_t status, void* user_data) {
  auto* op = static_cast<OpContext*>(user_data);
  op->engine->on_op_complete(op, status);
  ucp_request_free(request);
}

// What every message of the sender about transfer `id` carries.
Notice transfer_message(WireKind kind, const SendTransfer& t, uint64_t id) {
  Notice n;
  n.kind = kind;
  n.request_id = t.spec.request_id;
  n.transfer_id = id;
  n.layer_begin = t.spec.layer_begin;
  n.layer_end = t.spec.layer_end;
  n.num_blocks = uint32_t(t.spec.src_blocks.size());
  return n;
}

ucp_request_param_t request_param(OpContext* op) {
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  param.cb.send = send_callback;
  param.user_data = op;
  return param;
}

}  // namespace

Status TransferEngine::Impl::begin_send(PeerId peer, SendSpec spec, TransferCallback on_done,
                                        bool all_posted) {
  if (!on_done) return invalid_argument("begin_send needs a completion callback");
  // Once shutdown has run what was queued, nothing would start this one
  // (a callback of a failed transfer may call here).
  if (stopping_) return unavailable("the transfer engine is stopping");
  {
    std::lock_guard lock(api_mutex_);
    if (peer >= peer_layouts_.size() || peer_removed_[peer]) {
      return not_found("unknown peer " + std::to_string(peer));
    }
    BATON_RETURN_IF_ERROR(
        check_transfer(spec.transfer_id, spec.layer_begin, spec.layer_end, spec.deadline));
    BATON_RETURN_IF_ERROR(
        validate_block_lists(spec.src_blocks, pool_layout_, spec.dst_blocks, peer_layouts_[peer]));
    if (staging_ != nullptr && spec.src_blocks.size() > size_t(layout_.num_blocks)) {
      return resource_exhausted("transfer " + std::to_string(spec.transfer_id) + " of " +
                                std::to_string(spec.src_blocks.size()) +
                                " blocks needs as many staging slots; the pool has " +
                                std::to_string(layout_.num_blocks) + " (transfer.staging_blocks)");
    }
    int32_t posted = all_posted ? spec.layer_end : spec.layer_begin;
    SendTicket ticket;
    ticket.posted = posted;
    ticket.end = spec.layer_end;
    if (staging_ != nullptr) {
      ticket.staged_src = std::make_shared<const std::vector<int32_t>>(spec.src_blocks);
      ticket.copy_lane = next_copy_out_lane_++ % copy_out_->lanes();
    }
    if (!send_tickets_.emplace(spec.transfer_id, std::move(ticket)).second) {
      return invalid_argument("transfer " + std::to_string(spec.transfer_id) +
                              " is already in flight");
    }
  }
  uint64_t id = spec.transfer_id;
  enqueue(
      [this, peer, id, all_posted, spec = std::move(spec), on_done = std::move(on_done)]() mutable {
        // A cancel_send accepted before this command ran found no
        // transfer: it takes effect here.
        bool cancelled = false;
        {
          std::lock_guard lock(api_mutex_);
          auto ticket = send_tickets_.find(id);
          cancelled = ticket != send_tickets_.end() && ticket->second.cancelled;
        }
        SendTransfer& t = sends_[id];
        t.serial = next_serial_++;
        t.started = Clock::now();
        t.deadline = t.started + spec.deadline.value_or(config_.default_deadline);
        // A staged send's runs are between its slots, once it has them;
        // its layers are released to the wire as their copies are done.
        const bool staged = staging_ != nullptr;
        if (!staged) t.runs = merge_block_runs(spec.src_blocks, spec.dst_blocks);
        t.awaiting_slots = staged;
        t.issued_end = spec.layer_begin;
        t.granted_end = spec.layer_begin;
        t.posted_end = all_posted && !staged ? spec.layer_end : spec.layer_begin;
        t.spec = std::move(spec);
        t.peer = peer;
        t.on_done = std::move(on_done);
        t.hashes = BlockHashes(t.spec.layer_begin, t.spec.layer_end, t.spec.src_blocks.size());
        const auto layers = size_t(t.spec.layer_end - t.spec.layer_begin);
        t.layer_flushed.assign(layers, false);
        t.layer_announced.assign(layers, false);
        if (cancelled) return apply_cancel_send(id);
        if (staged) {
          {
            std::lock_guard lock(api_mutex_);
            waiting_for_slots_.push_back(id);
          }
          hand_out_slots();
          if (auto it = sends_.find(id); it != sends_.end() && it->second.awaiting_slots)
            ++counters_.sends_waited_for_slots;
        }
        start_send(id);
      });
  return Status::ok();
}

Status TransferEngine::Impl::post_layers(uint64_t transfer_id, int32_t layer_end) {
  std::unique_lock<std::mutex> in_order;
  if (staging_ != nullptr) in_order = std::unique_lock(staging_mutex_);
  int32_t staged_from = 0;
  size_t lane = 0;
  std::shared_ptr<const std::vector<int32_t>> staged_src, slots;
  {
    std::lock_guard lock(api_mutex_);
    auto it = send_tickets_.find(transfer_id);
    if (it == send_tickets_.end()) {
      return not_found("no transfer " + std::to_string(transfer_id) + " in flight");
    }
    SendTicket& ticket = it->second;
    if (ticket.cancelled) {
      return not_found("transfer " + std::to_string(transfer_id) + " was cancelled");
    }
    if (layer_end > ticket.end || layer_end < ticket.posted) {
      return out_of_range("post_layers(" + std::to_string(layer_end) + ") outside [" +
                          std::to_string(ticket.posted) + ", " + std::to_string(ticket.end) + "]");
    }
    staged_from = ticket.posted;
    ticket.posted = layer_end;
    lane = ticket.copy_lane;
    // A send still waiting for its slots copies these once it has them (its
    // release below only restarts its clock).
    if (ticket.staged_src != nullptr && ticket.slots != nullptr) {
      staged_src = ticket.staged_src;
      slots = ticket.slots;
      ++ticket.copies_pending;
    }
  }
  if (staged_src != nullptr) {
    // A staged pool's new layers go out on the send's lane of copy_out_,
    // one copy after another: the caller goes on to compute the next layer
    // meanwhile. A post of no new layers goes that way too, behind the
    // copies queued before it, so that its release sends nothing not yet
    // copied.
    copy_out_->post(lane, [this, transfer_id, staged_src, slots, staged_from, layer_end] {
      copy_out_layers(transfer_id, *staged_src, *slots, staged_from, layer_end);
    });
    return Status::ok();
  }
  if (staging_ != nullptr) layer_end = 0;  // waiting for slots: no layer is copied yet
  enqueue([this, transfer_id, layer_end] { release_layers(transfer_id, layer_end); });
  return Status::ok();
}

void TransferEngine::Impl::copy_out_layers(uint64_t id, const std::vector<int32_t>& blocks,
                                           const std::vector<int32_t>& slots, int32_t from,
                                           int32_t to) {
  bool cancelled = false;
  {
    std::lock_guard lock(api_mutex_);
    auto it = send_tickets_.find(id);
    cancelled = it == send_tickets_.end() || it->second.cancelled;
  }
  Status copied;
  if (!cancelled && from < to) {
    copied = stage(StageCopy::kOutOfPool, blocks, slots, from, to);
    if (!copied.is_ok()) copied = copied.with_context("transfer " + std::to_string(id));
  }
  enqueue([this, id, to, copied = std::move(copied)] {
    {
      // Counted down here, on the progress thread, not by the copy: until
      // this command runs the send cannot finish, so `id` cannot yet name
      // a new send that reuses it. (The ticket stays while a copy is
      // pending: maybe_finish_send waits.)
      std::lock_guard lock(api_mutex_);
      if (auto t = send_tickets_.find(id); t != send_tickets_.end()) --t->second.copies_pending;
    }
    auto it = sends_.find(id);
    if (it == sends_.end()) return;  // already reported
    // Layers it cannot send fail the transfer; the callback reports it.
    if (!copied.is_ok()) it->second.fail(copied);
    if (it->second.failed()) {
      dirty_sends_.push_back(id);  // its callback may have waited for this copy
      return;
    }
    release_layers(id, to);
  });
}

void TransferEngine::Impl::release_layers(uint64_t id, int32_t layer_end) {
  auto it = sends_.find(id);
  if (it == sends_.end()) return;  // already failed and reported
  SendTransfer& t = it->second;
  // Each release of layers restarts the clock, so the deadline bounds the
  // wire's time, not the producer's (a long prefill step between layers).
  t.deadline =
      std::max(t.deadline, Clock::now() + t.spec.deadline.value_or(config_.default_deadline));
  t.posted_end = std::max(t.posted_end, layer_end);
  pump(t, id);
}

Status TransferEngine::Impl::cancel_send(uint64_t transfer_id) {
  {
    std::lock_guard lock(api_mutex_);
    auto it = send_tickets_.find(transfer_id);
    if (it == send_tickets_.end()) {
      return not_found("no transfer " + std::to_string(transfer_id) + " in flight");
    }
    if (it->second.cancelled) {
      return not_found("transfer " + std::to_string(transfer_id) + " is already cancelled");
    }
    it->second.cancelled = true;
  }
  // Returns once nothing new will be posted; the callback waits for what is.
  enqueue_and_wait([this, transfer_id] { apply_cancel_send(transfer_id); }, transfer_id, "cancel");
  return Status::ok();
}

void TransferEngine::Impl::apply_cancel_send(uint64_t id) {
  auto it = sends_.find(id);
  if (it == sends_.end()) return;  // its callback has been taken to run already
  SendTransfer& t = it->second;
  t.fail(Status(StatusCode::kAborted, "transfer " + std::to_string(id) + " cancelled"),
         /*cancelled=*/true);
  // pump() posts nothing for a failed transfer, and a failed one sends no
  // notice; it finishes once its posted operations have completed (or, if
  // they are stuck past the deadline, its peer is torn down as for any
  // transfer that missed it).
  dirty_sends_.push_back(id);
}

void TransferEngine::Impl::start_send(uint64_t id) {
  SendTransfer& t = sends_[id];
  PeerState& peer = peers_[t.peer];
  if (peer.phase == PeerState::Phase::kIdle) connect(t.peer);
  if (peer.phase != PeerState::Phase::kReady) {
    peer.waiting.push_back(id);
    return;
  }
  pump(t, id);
}

OpContext* TransferEngine::Impl::send_op(const SendTransfer& t, uint64_t id, OpContext::Kind kind,
                                         const PeerState& peer) {
  auto* op = new OpContext{this, id, kind, t.peer, peer.generation};
  op->serial = t.serial;
  op->epoch = t.op_epoch;
  return op;
}

void TransferEngine::Impl::pump(SendTransfer& t, uint64_t id) {
  PeerState& peer = peers_[t.peer];
  if (t.failed() || peer.phase != PeerState::Phase::kReady) return;
  t.mode = peer.mode;
  int32_t ready_end = t.posted_end;
  if (t.mode == TransferMode::kRma) {
    // A grant the receiver may have written off already (it frees the
    // blocks close_timeout after granting, and granted after the ask): this
    // process stalled (stopped, starved) between ask and puts, whose bytes
    // would land in blocks given to another request. A quarter of the close
    // timeout is left for the puts to land; a grant that took longer than
    // the rest to come fails its transfer, which is recomputed.
    if (t.issued_end < t.granted_end && Clock::now() > t.asked_at + config_.close_timeout * 3 / 4) {
      t.fail(deadline_exceeded("transfer " + std::to_string(id) +
                               ": its put grant is too old to use (this process stalled, or "
                               "the grant took most of transfer.close_timeout_ms to come)"));
      dirty_sends_.push_back(id);
      return;
    }
    // One request covers every layer posted so far; more are asked for as
    // they come, so the round trip overlaps the producer.
    if (!t.asking && t.granted_end < t.posted_end) ask_to_put(t, id, peer);
    ready_end = std::min(ready_end, t.granted_end);
  }
  while (t.issued_end < ready_end && !t.failed()) {
    issue_layer(t, id, peer, t.issued_end);
    ++t.issued_end;
  }
  if (t.issued_end == t.spec.layer_end && t.phase() == SendTransfer::Phase::kPosting &&
      !t.failed()) {
    // Remote completion of every put/message before the notice goes out.
    t.start_flush();
    auto* op = send_op(t, id, OpContext::kFlush, peer);
    ucp_request_param_t param = request_param(op);
    ucs_status_ptr_t request = post_op(op, ucp_ep_flush_nbx(peer.ep, &param));
    if (UCS_PTR_IS_ERR(request)) {
      t.fail(ucx_error("ucp_ep_flush_nbx", UCS_PTR_STATUS(request), __FILE__, __LINE__));
    } else if (request == nullptr) {
      t.flush_completed();
    } else {
      ++t.outstanding;
    }
  }
  dirty_sends_.push_back(id);
}

void TransferEngine::Impl::issue_layer(SendTransfer& t, uint64_t id, PeerState& peer,
                                       int32_t layer) {
  ByteMover& mover = *peer.mover;
  const bool in_place = mover.copies_in_place();
  for (const BlockRun& run : t.runs) {
    const RunToMove move{.transfer_id = id,
                         .layer = layer,
                         .dst_block = run.dst_block,
                         .count = run.count,
                         .src = pool_ + layout_.block_byte_offset(layer, run.src_block),
                         .block_bytes = layout_.block_bytes(),
                         .hashes = in_place && config_.verify_checksum ? &t.hashes : nullptr,
                         .first_pair = run.first_pair};
    ucs_status_ptr_t request = nullptr;
    if (in_place) {
      std::vector<uint8_t> no_header;
      request = mover.move(move, ucp_request_param_t{}, no_header);
    } else {
      auto* op = send_op(t, id, OpContext::kSendData, peer);
      request = post_op(op, mover.move(move, request_param(op), op->header));
    }
    if (UCS_PTR_IS_ERR(request)) {
      t.fail(ucx_error(mover.call(), UCS_PTR_STATUS(request), __FILE__, __LINE__));
      failed_endpoints_.emplace_back(t.peer, peer.generation, UCS_PTR_STATUS(request));
      return;
    }
    const size_t length = size_t(run.count) * layout_.block_bytes();
    if (request != nullptr) ++t.outstanding;
    ++t.ops;
    t.bytes += length;
    counters_.ops_posted++;
    counters_.bytes_sent += length;
  }
  if (!config_.verify_checksum) return;
  if (in_place) {
    // Hashed as it was copied. The layer is in the receiver's pool now: it
    // can hash it while we copy the next one, instead of after the notice.
    Notice landed = transfer_message(WireKind::kLayerLanded, t, id);
    landed.layer_begin = layer;
    landed.layer_end = layer + 1;
    landed.checksum = t.hashes.layer_digest(layer);
    // Lost, it costs only time: the receiver hashes unannounced layers after
    // the notice.
    send_control(peer.ep, landed, /*want_reply=*/false, "layer announcement");
  } else {
    // Hashed while the layer is on the wire; the source is stable until
    // completion. A staged receiver gets the layer's hash once it is done.
    queue_hash({id, t.serial, /*sender=*/true, layer, every_pair(t.spec.src_blocks.size())},
               t.hash_jobs);
    // The last layer's puts land with the flush before the notice.
    if (t.mode == TransferMode::kRma && (peer.descriptor.flags & kPoolFlagStaged) != 0 &&
        layer + 1 < t.spec.layer_end)
      flush_layer(t, id, peer, layer);
  }
}

void TransferEngine::Impl::flush_layer(SendTransfer& t, uint64_t id, PeerState& peer,
                                       int32_t layer) {
  auto* op = send_op(t, id, OpContext::kLayerFlush, peer);
  op->layer = layer;
  ucp_request_param_t param = request_param(op);
  ucs_status_ptr_t request = post_op(op, ucp_ep_flush_nbx(peer.ep, &param));
  if (UCS_PTR_IS_ERR(request)) {
    t.fail(ucx_error("ucp_ep_flush_nbx", UCS_PTR_STATUS(request), __FILE__, __LINE__));
    failed_endpoints_.emplace_back(t.peer, peer.generation, UCS_PTR_STATUS(request));
  } else if (request == nullptr) {
    t.layer_flushed[size_t(layer - t.spec.layer_begin)] = true;
    announce_layer_hash(id, layer);
  } else {
    ++t.outstanding;
  }
}

void TransferEngine::Impl::maybe_finish_send(uint64_t id) {
  auto it = sends_.find(id);
  if (it == sends_.end()) return;
  SendTransfer& t = it->second;
  if (t.ready_for_notice()) {
    t.digest = t.hashes.digest();
    PeerState& peer = peers_[t.peer];
    Notice n = transfer_message(WireKind::kNotice, t, id);
    n.ops = t.ops;
    n.bytes = t.bytes;
    n.checksum = t.digest;
    n.flags = (t.mode == TransferMode::kAm ? kNoticeFlagAmData : 0) |
              (t.mode == TransferMode::kTag ? kNoticeFlagAmData | kNoticeFlagTagData : 0) |
              (config_.verify_checksum ? 0 : kNoticeFlagNoChecksum);
    if (notices_to_drop_ > 0) {
      // Lost on the way: the ack never comes, and the deadline ends the transfer.
      --notices_to_drop_;
      spdlog::warn(
          "kv_transfer[{}]: send {} (request {}): completion notice dropped "
          "(BATON_FAULT_DROP_NOTICES)",
          config_.node_name, id, t.spec.request_id);
      t.notice_out();
      return;
    }
    auto* op = send_op(t, id, OpContext::kNotice, peer);
    op->header = encode_notice(n);
    ucp_request_param_t param = request_param(op);
    param.op_attr_mask |= UCP_OP_ATTR_FIELD_FLAGS;
    param.flags = UCP_AM_SEND_FLAG_REPLY | UCP_AM_SEND_FLAG_EAGER;
    t.notice_out();
    ucs_status_ptr_t request = post_op(op, ucp_am_send_nbx(peer.ep, kAmControl, op->header.data(),
                                                           op->header.size(), nullptr, 0, &param));
    if (UCS_PTR_IS_ERR(request)) {
      t.fail(ucx_error("ucp_am_send_nbx(notice)", UCS_PTR_STATUS(request), __FILE__, __LINE__));
    } else if (request != nullptr) {
      ++t.outstanding;
    }
  }
  if (report_puts_stopped(t, id)) return;
  if (!t.finished()) return;
  {
    std::lock_guard lock(api_mutex_);
    auto ticket = send_tickets_.find(id);
    // The callback frees the source blocks: a copy of them still queued or
    // running (the transfer failed or was cancelled meanwhile) is waited
    // for; its end marks the send dirty again. Once the ticket is gone no
    // copy can be queued. (A send that succeeded has none left: its last
    // layers went out after their copy.)
    if (ticket != send_tickets_.end() && ticket->second.copies_pending > 0) return;
    if (ticket != send_tickets_.end()) {
      // No copy writes the slots, no operation reads them: free.
      if (ticket->second.slots != nullptr) slots_.give_back(*ticket->second.slots);
      send_tickets_.erase(ticket);
    }
    std::erase(waiting_for_slots_, id);
  }
  TransferResult r;
  r.status = t.failure();
  r.request_id = t.spec.request_id;
  r.transfer_id = id;
  r.bytes = t.bytes;
  r.ops = t.ops;
  r.checksum = t.digest;
  r.mode = t.mode;
  r.started = t.started;
  r.finished = Clock::now();
  (r.status.is_ok() ? counters_.sends_ok : counters_.sends_failed)++;
  if (t.cancelled()) {
    spdlog::info("kv_transfer[{}]: send {} (request {}) cancelled", config_.node_name, id,
                 r.request_id);
  } else if (!r.status.is_ok()) {
    spdlog::warn("kv_transfer[{}]: send {} (request {}) failed: {}", config_.node_name, id,
                 r.request_id, r.status.to_string());
  }
  TransferCallback done = std::move(t.on_done);
  sends_.erase(it);
  if (staging_ != nullptr) hand_out_slots();
  done(r);
}

void TransferEngine::Impl::ask_to_put(SendTransfer& t, uint64_t id, PeerState& peer) {
  Notice n = transfer_message(WireKind::kPutAsk, t, id);
  n.layer_begin = t.granted_end;  // the layers asked for
  n.layer_end = t.posted_end;
  t.asking = true;
  t.asked_at = Clock::now();
  if (!send_control(peer.ep, n, /*want_reply=*/true, "put request")) {
    t.fail(unavailable("transfer " + std::to_string(id) + ": put request not sent"));
  }
}

void TransferEngine::Impl::handle_put_grant(const Notice& n) {
  auto it = sends_.find(n.transfer_id);
  if (it == sends_.end() || !it->second.asking || it->second.spec.request_id != n.request_id) {
    reject_notice("put grant for transfer " + std::to_string(n.transfer_id) +
                  " that asked none (late or duplicate)");
    return;
  }
  SendTransfer& t = it->second;
  t.asking = false;
  if (n.status_code == uint32_t(StatusCode::kOk)) {
    t.granted_end = std::max(t.granted_end, n.layer_end);
    granted_sends_.push_back(n.transfer_id);  // pumped by the loop, not in this callback
  } else {
    t.fail(Status(StatusCode(n.status_code),
                  "receiver refused puts of transfer " + std::to_string(n.transfer_id)));
  }
  dirty_sends_.push_back(n.transfer_id);
}

bool TransferEngine::Impl::report_puts_stopped(SendTransfer& t, uint64_t id) {
  // Only a failed RMA send that was granted layers and never sent its notice
  // (which would say the same) leaves a receiver waiting; a torn-down
  // endpoint has nobody left to tell.
  PeerState& peer = peers_[t.peer];
  if (!t.owes_stop_report() || t.outstanding != 0) {
    return t.outstanding != 0 && t.stop_report() == SendTransfer::StopReport::kFlushing;
  }
  if (peer.phase != PeerState::Phase::kReady) {
    t.stop_report_sent();
    return false;
  }
  if (t.stop_report() == SendTransfer::StopReport::kNone) {
    // Every put posted so far reaches the receiver before the report.
    t.stop_report_flushing();
    auto* op = send_op(t, id, OpContext::kFlush, peer);
    ucp_request_param_t param = request_param(op);
    ucs_status_ptr_t request = post_op(op, ucp_ep_flush_nbx(peer.ep, &param));
    if (request != nullptr && !UCS_PTR_IS_ERR(request)) {
      ++t.outstanding;
      return true;
    }
  }
  t.stop_report_sent();
  send_control(peer.ep, transfer_message(WireKind::kPutsStopped, t, id), /*want_reply=*/false,
               "puts-stopped report");
  return false;
}

void TransferEngine::Impl::handle_ack(const Notice& n) {
  auto it = sends_.find(n.transfer_id);
  if (it == sends_.end() || it->second.phase() != SendTransfer::Phase::kAwaitingAck ||
      it->second.spec.request_id != n.request_id) {
    reject_notice("ack for transfer " + std::to_string(n.transfer_id) +
                  " that awaits none (late or duplicate)");
    return;
  }
  it->second.acked(Status(StatusCode(n.status_code), ""), n.transfer_id);
  dirty_sends_.push_back(n.transfer_id);
}

Status TransferEngine::Impl::send_control_bytes(PeerId peer_id, std::vector<uint8_t> bytes) {
  {
    std::lock_guard lock(api_mutex_);
    if (peer_id >= peer_layouts_.size() || peer_removed_[peer_id]) {
      return not_found("unknown peer");
    }
  }
  enqueue([this, peer_id, bytes = std::move(bytes)]() mutable {
    PeerState& peer = peers_[peer_id];
    if (peer.phase != PeerState::Phase::kReady) {
      spdlog::warn("kv_transfer[{}]: control bytes to unconnected peer {} dropped",
                   config_.node_name, peer_id);
      return;
    }
    auto* op = new OpContext{this, 0, OpContext::kAck, peer_id, peer.generation};
    op->header = std::move(bytes);
    ucp_request_param_t param = request_param(op);
    param.op_attr_mask |= UCP_OP_ATTR_FIELD_FLAGS;
    param.flags = UCP_AM_SEND_FLAG_REPLY | UCP_AM_SEND_FLAG_EAGER;
    post_op(op, ucp_am_send_nbx(peer.ep, kAmControl, op->header.data(), op->header.size(), nullptr,
                                0, &param));
  });
  return Status::ok();
}

// A layer's source blocks are hashed: a receiver that stages its pool copies
// the layer in as soon as it has landed and matches this, instead of after
// the whole transfer. Messages it counts as they land (tagged, AM); puts land
// unseen, so with them the notice waits for the layer's flush too.
void TransferEngine::Impl::announce_layer_hash(uint64_t id, int32_t layer) {
  auto it = sends_.find(id);
  if (it == sends_.end() || it->second.failed()) return;
  SendTransfer& t = it->second;
  PeerState& peer = peers_[t.peer];
  if ((peer.descriptor.flags & kPoolFlagStaged) == 0 || peer.phase != PeerState::Phase::kReady)
    return;
  WireKind kind = WireKind::kLayerHash;
  if (t.mode == TransferMode::kRma) {
    const auto i = size_t(layer - t.spec.layer_begin);
    if (!t.layer_flushed[i] || !t.hashes.layer_complete(layer) || t.layer_announced[i]) return;
    t.layer_announced[i] = true;
    kind = WireKind::kLayerLanded;
  } else if (t.mode != TransferMode::kTag && t.mode != TransferMode::kAm) {
    return;
  }
  Notice hashed = transfer_message(kind, t, id);
  hashed.layer_begin = layer;
  hashed.layer_end = layer + 1;
  hashed.checksum = t.hashes.layer_digest(layer);
  // Lost, it costs only time: the receiver copies unverified layers in after the notice.
  send_control(peer.ep, hashed, /*want_reply=*/false, "layer hash");
}

}  // namespace baton::kv_transfer
