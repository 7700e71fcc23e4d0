// kv_transfer/engine_recv.cc — the receiver: expectations, AM data landing in
// the expected blocks, notices, checksum verification, acks.
#include <algorithm>
#include <cstring>

#include "common/logging.h"
#include "kv_transfer/engine_impl.h"

namespace baton::kv_transfer {
namespace {

// Verdicts of receives failed on their data kept for their senders to ask:
// far more than the transfers one sender has in flight to a receiver.
constexpr size_t kKeptDataVerdicts = 256;

// A receive failed on its bytes: a checksum that did not match, or a copy
// into the staged pool that failed.
bool failed_on_data(const Status& s) {
  return s.code() == StatusCode::kDataLoss || s.code() == StatusCode::kInternal;
}

void recv_callback(void* request, ucs_status_t status, size_t /*length*/, void* user_data) {
  auto* op = static_cast<OpContext*>(user_data);
  op->engine->on_op_complete(op, status);
  ucp_request_free(request);
}

void tag_recv_callback(void* request, ucs_status_t status, const ucp_tag_recv_info_t* /*info*/,
                       void* user_data) {
  auto* op = static_cast<OpContext*>(user_data);
  op->engine->on_op_complete(op, status);
  ucp_request_free(request);
}

void ack_callback(void* request, ucs_status_t status, void* user_data) {
  auto* op = static_cast<OpContext*>(user_data);
  op->engine->on_op_complete(op, status);
  ucp_request_free(request);
}

}  // namespace

Status TransferEngine::Impl::expect(RecvSpec spec, TransferCallback on_done,
                                    std::vector<int32_t>* wire_blocks) {
  if (!on_done) return invalid_argument("expect needs a completion callback");
  if (stopping_) return unavailable("the transfer engine is stopping");
  if (staging_ != nullptr && wire_blocks == nullptr) {
    return invalid_argument(
        "a staged pool's expect() must say which slots the sender is to write (wire_blocks)");
  }
  BATON_RETURN_IF_ERROR(
      check_transfer(spec.transfer_id, spec.layer_begin, spec.layer_end, spec.deadline));
  BATON_RETURN_IF_ERROR(
      validate_block_lists(spec.dst_blocks, pool_layout_, spec.dst_blocks, pool_layout_));
  std::vector<int32_t> pool_blocks;
  {
    std::lock_guard lock(api_mutex_);
    if (recv_tickets_.contains(spec.transfer_id)) {
      return invalid_argument("transfer " + std::to_string(spec.transfer_id) +
                              " is already expected");
    }
    if (staging_ != nullptr) {
      // The bytes land in slots, copied into the pool's blocks once verified.
      const size_t n = spec.dst_blocks.size();
      if (size_t(slots_.free()) < n) {
        return resource_exhausted(
            "transfer " + std::to_string(spec.transfer_id) + " of " + std::to_string(n) +
            " blocks needs as many staging slots; " + std::to_string(slots_.free()) + " of " +
            std::to_string(layout_.num_blocks) + " are free (transfer.staging_blocks)");
      }
      pool_blocks = std::move(spec.dst_blocks);
      spec.dst_blocks = slots_.take(int32_t(n));
    }
    recv_tickets_.emplace(spec.transfer_id, false);
  }
  if (wire_blocks != nullptr) *wire_blocks = spec.dst_blocks;
  uint64_t id = spec.transfer_id;
  // The expectation must be live before the caller tells the sender to go:
  // data that arrived while it was still queued would be rejected as unknown.
  // Past the bounded wait the expectation still goes live and still ends with
  // its callback, which alone says when the blocks may be freed, so returning
  // is safe either way.
  auto command = [this, id, spec = std::move(spec), pool_blocks = std::move(pool_blocks),
                  on_done = std::move(on_done)]() mutable {
    Expectation& e = expectations_[id];
    e.serial = next_serial_++;
    e.started = Clock::now();
    e.deadline = e.started + spec.deadline.value_or(config_.default_deadline);
    e.abandon_after = e.deadline + config_.close_timeout;
    for (size_t i = 0; i < spec.dst_blocks.size(); ++i) e.pair_of[spec.dst_blocks[i]] = i;
    e.hashes = BlockHashes(spec.layer_begin, spec.layer_end, spec.dst_blocks.size());
    e.expected_bytes = uint64_t(spec.dst_blocks.size()) * layout_.block_bytes() *
                       uint64_t(spec.layer_end - spec.layer_begin);
    if (staging_ != nullptr) {
      const auto layers = size_t(spec.layer_end - spec.layer_begin);
      e.sender_layer_hash.assign(layers, std::nullopt);
      e.layer_copy_posted.assign(layers, false);
    }
    e.spec = std::move(spec);
    e.pool_blocks = std::move(pool_blocks);
    e.on_done = std::move(on_done);
  };
  enqueue_and_wait(std::move(command), id, "registration");
  return Status::ok();
}

Status TransferEngine::Impl::cancel_expect(uint64_t transfer_id) {
  {
    std::lock_guard lock(api_mutex_);
    auto it = recv_tickets_.find(transfer_id);
    if (it == recv_tickets_.end()) {
      return not_found("no expectation of transfer " + std::to_string(transfer_id));
    }
    if (it->second) {
      return not_found("expectation of transfer " + std::to_string(transfer_id) +
                       " is already cancelled");
    }
    it->second = true;
  }
  // Returns once data arriving for it is rejected; the callback may run
  // before or after (it is not waited for, so it may take the caller's locks).
  enqueue_and_wait([this, transfer_id] { apply_cancel_expect(transfer_id); }, transfer_id,
                   "cancel");
  return Status::ok();
}

void TransferEngine::Impl::apply_cancel_expect(uint64_t id) {
  // Commands run in order, so the registration has run; the expectation is
  // gone only if its callback has been taken to run already.
  auto it = expectations_.find(id);
  if (it == expectations_.end()) return;
  Expectation& e = it->second;
  // A verdict already reached stands.
  e.fail(
      Status(StatusCode::kAborted, "expectation of transfer " + std::to_string(id) + " cancelled"),
      /*cancelled=*/true);
  // Receives in flight finish (a live sender completes them within moments)
  // or are abandoned like those of an expired transfer, but counted from now:
  // the caller wants the blocks back, and a dead sender never completes them.
  e.abandon_after = std::min(e.abandon_after, Clock::now() + config_.close_timeout);
  dirty_recvs_.push_back(id);
}

void TransferEngine::Impl::reject_notice(const std::string& why) {
  counters_.notices_rejected++;
  spdlog::warn("kv_transfer[{}]: rejected control message: {}", config_.node_name, why);
}

ucs_status_t TransferEngine::Impl::on_control(const void* header, size_t header_length,
                                              ucp_ep_h reply_ep) {
  Result<Notice> n =
      decode_notice({static_cast<const uint8_t*>(header), header == nullptr ? 0 : header_length});
  if (!n.is_ok()) {
    reject_notice(n.status().message());
    return UCS_OK;
  }
  switch (n->kind) {
    case WireKind::kAck:
      handle_ack(*n);
      break;
    case WireKind::kPutAsk:
      handle_put_ask(*n, reply_ep);
      break;
    case WireKind::kPutGrant:
      handle_put_grant(*n);
      break;
    case WireKind::kPutsStopped:
      handle_puts_stopped(*n);
      break;
    case WireKind::kLayerLanded:
      landed_layers_.push_back(*n);  // hashed by the loop, not in this callback
      break;
    case WireKind::kLayerHash:
      record_layer_hash(*n);
      break;
    default:
      handle_notice(*n, reply_ep);
  }
  return UCS_OK;
}

// Answered at once, on the endpoint the request came by: a reply endpoint is
// only sure to live while its message is being handled, so the receiver never
// keeps one to reach the sender later. It stops a sender by refusing its next
// request instead.
void TransferEngine::Impl::handle_put_ask(const Notice& n, ucp_ep_h reply_ep) {
  if (reply_ep == nullptr) {
    reject_notice("put request for transfer " + std::to_string(n.transfer_id) +
                  " without a reply path");
    return;
  }
  auto it = expectations_.find(n.transfer_id);
  Status verdict;
  if (it == expectations_.end() || it->second.state() != Expectation::State::kReceiving) {
    std::optional<Status> judged = data_verdict(it, n);
    verdict = judged.value_or(
        Status(StatusCode::kAborted, "transfer " + std::to_string(n.transfer_id) +
                                         " is not expected (late, cancelled or expired)"));
  } else if (const RecvSpec& spec = it->second.spec;
             n.request_id != spec.request_id || n.num_blocks != spec.dst_blocks.size() ||
             n.layer_begin < spec.layer_begin || n.layer_end > spec.layer_end) {
    verdict = invalid_argument("put request for transfer " + std::to_string(n.transfer_id) +
                               " does not match its expectation");
  } else {
    it->second.granted = true;
    it->second.last_grant = Clock::now();
  }
  if (!verdict.is_ok()) reject_notice(verdict.message());
  Notice grant = n;
  grant.kind = WireKind::kPutGrant;
  grant.status_code = uint32_t(verdict.code());
  grant.flags = 0;
  send_control(reply_ep, grant, /*want_reply=*/false, "put grant");
}

// A layer the sender copied into our pool, or whose puts into our staged
// slots it flushed: hash it while the next one is on its way, instead of all
// of them after the notice (and copy it in once it matches).
void TransferEngine::Impl::hash_announced_layer(const Notice& n) {
  Expectation* e = granted_expectation(n, "layer announcement");
  if (e == nullptr) return;
  const int32_t layer = n.layer_begin;
  if (!e->open() || layer < e->spec.layer_begin || layer >= e->spec.layer_end) return;
  if (!config_.verify_checksum) return;
  hash_layer(*e, layer);
  if (!e->sender_layer_hash.empty()) note_sender_layer_hash(*e, n);
}

void TransferEngine::Impl::note_sender_layer_hash(Expectation& e, const Notice& n) {
  e.sender_layer_hash[size_t(n.layer_begin - e.spec.layer_begin)] = n.checksum;
  dirty_recvs_.push_back(n.transfer_id);
}

void TransferEngine::Impl::record_layer_hash(const Notice& n) {
  auto it = expectations_.find(n.transfer_id);
  if (it == expectations_.end() || it->second.spec.request_id != n.request_id ||
      it->second.sender_layer_hash.empty() || n.layer_begin < it->second.spec.layer_begin ||
      n.layer_begin >= it->second.spec.layer_end || n.layer_end != n.layer_begin + 1) {
    reject_notice("layer hash for transfer " + std::to_string(n.transfer_id) +
                  " that expects none (late, or not a staged pool's)");
    return;
  }
  Expectation& e = it->second;
  if (e.open()) note_sender_layer_hash(e, n);  // else failed meanwhile, or all judged
}

void TransferEngine::Impl::copy_in_verified_layers(uint64_t id, Expectation& e) {
  for (int32_t layer = e.spec.layer_begin; layer < e.spec.layer_end; ++layer) {
    const auto i = size_t(layer - e.spec.layer_begin);
    if (e.layer_copy_posted[i] || !e.sender_layer_hash[i] || !e.hashes.layer_complete(layer))
      continue;
    if (e.hashes.layer_digest(layer) != *e.sender_layer_hash[i]) {
      e.fail(data_loss("checksum mismatch on transfer " + std::to_string(id) + " in layer " +
                       std::to_string(layer) + "; it was not copied into the pool"));
      dirty_recvs_.push_back(id);
      return;
    }
    e.layer_copy_posted[i] = true;
    post_copy_in(id, e, {layer});
  }
}

void TransferEngine::Impl::post_copy_in(uint64_t id, Expectation& e, std::vector<int32_t> layers) {
  ++e.copies_in_flight;
  // A receive's copies keep to the lane its serial picks (in order there);
  // other receives' run beside them.
  copy_in_->post(size_t(e.serial), [this, id, serial = e.serial, blocks = e.pool_blocks,
                                    slots = e.spec.dst_blocks, layers = std::move(layers)] {
    Status copied;
    for (size_t i = 0; i < layers.size() && copied.is_ok();) {
      size_t j = i + 1;  // adjacent layers in one copy
      while (j < layers.size() && layers[j] == layers[j - 1] + 1) ++j;
      copied = stage(StageCopy::kIntoPool, blocks, slots, layers[i], layers[j - 1] + 1);
      i = j;
    }
    {
      std::lock_guard lock(copied_in_mutex_);
      copied_in_.push_back({id, serial, std::move(copied)});
      has_copied_in_ = true;
    }
    ucp_worker_signal(worker_.get());
  });
}

// Queues every block of `layer` for hashing, unless it already was.
void TransferEngine::Impl::hash_layer(Expectation& e, int32_t layer) {
  if (e.layer_hashed.empty())
    e.layer_hashed.assign(size_t(e.spec.layer_end - e.spec.layer_begin), false);
  if (e.layer_hashed[size_t(layer - e.spec.layer_begin)]) return;
  e.layer_hashed[size_t(layer - e.spec.layer_begin)] = true;
  corrupt_for_tests(e, layer, e.spec.dst_blocks.front());
  queue_hash(
      {e.spec.transfer_id, e.serial, /*sender=*/false, layer, every_pair(e.spec.dst_blocks.size())},
      e.hash_jobs);
}

void TransferEngine::Impl::handle_puts_stopped(const Notice& n) {
  Expectation* e = granted_expectation(n, "puts-stopped report");
  if (e == nullptr) return;
  e->puts_stopped = true;
  dirty_recvs_.push_back(n.transfer_id);
}

Expectation* TransferEngine::Impl::granted_expectation(const Notice& n, const char* what) {
  auto it = expectations_.find(n.transfer_id);
  if (it == expectations_.end() || !it->second.granted ||
      it->second.spec.request_id != n.request_id) {
    reject_notice(std::string(what) + " for transfer " + std::to_string(n.transfer_id) +
                  " that granted no puts (late?)");
    return nullptr;
  }
  return &it->second;
}

Expectation* TransferEngine::Impl::accept_run(uint64_t transfer_id, int32_t layer,
                                              int32_t dst_block, int64_t block_count, size_t length,
                                              std::string& why) {
  auto it = expectations_.find(transfer_id);
  if (it == expectations_.end() || !it->second.open()) {
    why = "transfer " + std::to_string(transfer_id) + " is not expected (late?)";
    return nullptr;
  }
  Expectation& e = it->second;
  if (layer < e.spec.layer_begin || layer >= e.spec.layer_end) {
    why = "layer " + std::to_string(layer) + " outside the expected range";
    return nullptr;
  }
  if (block_count <= 0 || size_t(block_count) * layout_.block_bytes() != length ||
      e.received_bytes + length > e.expected_bytes) {
    why = "data length " + std::to_string(length) + " does not match its blocks";
    return nullptr;
  }
  for (int64_t b = dst_block; b < dst_block + block_count; ++b) {
    if (!e.pair_of.contains(int32_t(b))) {
      why = "block " + std::to_string(b) + " is not reserved for transfer " +
            std::to_string(transfer_id);
      return nullptr;
    }
  }
  return &e;
}

void TransferEngine::Impl::landing_started(Expectation& e, uint64_t transfer_id,
                                           ucs_status_ptr_t request, const char* call) {
  if (UCS_PTR_IS_ERR(request)) {
    e.fail(ucx_error(call, UCS_PTR_STATUS(request), __FILE__, __LINE__));
    dirty_recvs_.push_back(transfer_id);
  } else if (request == nullptr) {  // completed in place; op already deleted
    e.received_bytes += op_bytes_;
    hash_landed(e, op_layer_, op_block_, op_count_, /*now=*/true);  // copied just now
  } else {
    ++e.outstanding;
  }
}

ucs_status_t TransferEngine::Impl::on_data(const void* header, size_t header_length, void* data,
                                           size_t length, const ucp_am_recv_param_t* param) {
  bool rendezvous = (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0;
  std::string why;
  Result<DataHeader> h = decode_data_header({static_cast<const uint8_t*>(header), header_length});
  Expectation* e = nullptr;
  if (!h.is_ok()) {
    why = h.status().message();
  } else {
    e = accept_run(h->transfer_id, h->layer, h->dst_block, h->block_count, length, why);
  }
  if (e == nullptr) {
    counters_.data_rejected++;
    spdlog::warn("kv_transfer[{}]: rejected KV data: {}", config_.node_name, why);
    if (rendezvous) discard_rendezvous(data, length);
    return UCS_OK;
  }
  uint8_t* dst = pool_ + layout_.block_byte_offset(h->layer, h->dst_block);
  if (!rendezvous) {
    std::memcpy(dst, data, length);
    e->received_bytes += length;
    hash_landed(*e, h->layer, h->dst_block, h->block_count, /*now=*/true);
    return UCS_OK;
  }
  // Rendezvous: UCX fetches the bytes straight into the reserved blocks.
  OpContext* op = landing_op(*e, h->transfer_id, h->layer, h->dst_block, h->block_count, length);
  ucp_request_param_t rp{};
  rp.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  rp.cb.recv_am = recv_callback;
  rp.user_data = op;
  landing_started(*e, h->transfer_id,
                  post_op(op, ucp_am_recv_data_nbx(worker_.get(), data, dst, length, &rp)),
                  "ucp_am_recv_data_nbx");
  return UCS_OK;
}

OpContext* TransferEngine::Impl::landing_op(Expectation& e, uint64_t transfer_id, int32_t layer,
                                            int32_t block, int32_t count, size_t length) {
  auto* op = new OpContext{this, transfer_id, OpContext::kRecvData};
  op->serial = e.serial;
  op->epoch = e.op_epoch;
  op->bytes = op_bytes_ = length;
  op->layer = op_layer_ = layer;
  op->first_block = op_block_ = block;
  op->block_count = op_count_ = count;
  return op;
}

int TransferEngine::Impl::receive_tagged() {
  int received = 0;
  ucp_tag_recv_info_t info{};
  while (ucp_tag_message_h message = ucp_tag_probe_nb(worker_.get(), 0, 0, /*remove=*/1, &info)) {
    ++received;
    uint64_t transfer_id = info.sender_tag >> 32;
    int32_t layer = int32_t((info.sender_tag >> kTagBlockBits) & ((1u << kTagLayerBits) - 1));
    int32_t block = int32_t(info.sender_tag & ((1u << kTagBlockBits) - 1));
    int64_t count = int64_t(info.length / layout_.block_bytes());
    std::string why;
    Expectation* e = accept_run(transfer_id, layer, block, count, info.length, why);
    ucp_request_param_t rp{};
    rp.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    rp.cb.recv = tag_recv_callback;
    if (e == nullptr) {
      // Drained into scratch memory no block owns, then dropped, a few at
      // a time (drain_discards). At most a run's worth: a longer message
      // (no run of this pool is) is received truncated, not given the
      // memory its peer claims.
      counters_.data_rejected++;
      spdlog::warn("kv_transfer[{}]: rejected tagged KV data: {}", config_.node_name, why);
      pending_discards_.push_back({message, std::min<size_t>(info.length, max_run_bytes())});
      continue;
    }
    uint8_t* dst = pool_ + layout_.block_byte_offset(layer, block);
    OpContext* op = landing_op(*e, transfer_id, layer, block, int32_t(count), info.length);
    rp.user_data = op;
    landing_started(
        *e, transfer_id,
        post_op(op, ucp_tag_msg_recv_nbx(worker_.get(), dst, info.length, message, &rp)),
        "ucp_tag_msg_recv_nbx");
  }
  drain_discards();
  return received;
}

void TransferEngine::Impl::drain_discards() {
  while (tagged_discards_in_flight_ < kMaxRejectedInFlight && !pending_discards_.empty()) {
    const PendingDiscard d = pending_discards_.front();
    pending_discards_.pop_front();
    auto* op = new OpContext{this, 0, OpContext::kDiscardTag};
    op->header.resize(d.length);
    // Counted before the call: UCX may complete the receive, and call back,
    // before it returns the request.
    ++tagged_discards_in_flight_;
    discard_scratch_changed(int64_t(d.length));
    ucp_request_param_t rp{};
    rp.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    rp.cb.recv = tag_recv_callback;
    rp.user_data = op;
    if (!UCS_PTR_IS_PTR(post_op(op, ucp_tag_msg_recv_nbx(worker_.get(), op->header.data(), d.length,
                                                         d.message, &rp)))) {
      --tagged_discards_in_flight_;  // done at once: no callback, post_op freed the op
      discard_scratch_changed(-int64_t(d.length));
    }
  }
}

void TransferEngine::Impl::discard_rendezvous(void* data_desc, size_t length) {
  // UCX 1.13 asserts in the sender's ATS handler when a rendezvous is released
  // unread (ucp_am_data_release over shared memory), so rejected bytes are
  // drained into scratch memory that no block owns, then dropped. Bytes no
  // run of this pool could have are not allocated: they are released unread
  // (only a sender that claims them can trip that assert).
  if (length > max_run_bytes()) return;
  auto* op = new OpContext{this, 0, OpContext::kDiscard};
  op->header.resize(length);
  discard_scratch_changed(int64_t(length));
  ucp_request_param_t rp{};
  rp.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  rp.cb.recv_am = recv_callback;
  rp.user_data = op;
  if (!UCS_PTR_IS_PTR(post_op(
          op, ucp_am_recv_data_nbx(worker_.get(), data_desc, op->header.data(), length, &rp)))) {
    discard_scratch_changed(-int64_t(length));  // no callback will come; post_op freed the op
  }
}

void TransferEngine::Impl::discard_scratch_changed(int64_t bytes) {
  discard_bytes_alive_ = size_t(int64_t(discard_bytes_alive_) + bytes);
  counters_.discard_scratch_peak =
      std::max<uint64_t>(counters_.discard_scratch_peak, discard_bytes_alive_);
}

void TransferEngine::Impl::corrupt_for_tests(Expectation& e, int32_t layer, int32_t block) {
  if (config_.corrupt_landed_layer != layer || e.corrupted) return;
  e.corrupted = true;
  // An 8-bit block's bit goes into a row's scale (its second byte): a scale
  // is checksummed as the codes are.
  const bool scales = is_quantized(layout_.dtype);
  pool_[scales ? layout_.scale_byte_offset(layer, block, KvPart::kValue, 0, 0) + 1
               : layout_.block_byte_offset(layer, block)] ^= 1;
  spdlog::warn("kv_transfer[{}]: fault injection: flipped a bit of layer {} of transfer {}{}",
               config_.node_name, layer, e.spec.transfer_id, scales ? ", in a scale" : "");
}

void TransferEngine::Impl::hash_landed(Expectation& e, int32_t layer, int32_t first_block,
                                       int32_t count, bool now) {
  if (!config_.verify_checksum) return;
  corrupt_for_tests(e, layer, first_block);
  if (now) {
    for (int32_t b = first_block; b < first_block + count; ++b) {
      e.hashes.set(layer, e.pair_of[b],
                   block_hash(pool_ + layout_.block_byte_offset(layer, b), layout_.block_bytes()));
    }
    return;
  }
  HashJob job{e.spec.transfer_id, e.serial, /*sender=*/false, layer, {}, 0};
  for (int32_t b = first_block; b < first_block + count; ++b) job.pairs.push_back(e.pair_of[b]);
  queue_hash(std::move(job), e.hash_jobs);
}

// Puts land unseen: unless the sender announced each layer as it landed, the
// layers are hashed once its notice says they are all in.
void TransferEngine::Impl::hash_unseen_layers(Expectation& e) {
  for (int32_t layer = e.spec.layer_begin; layer < e.spec.layer_end; ++layer) hash_layer(e, layer);
}

void TransferEngine::Impl::handle_notice(const Notice& n, ucp_ep_h reply_ep) {
  auto it = expectations_.find(n.transfer_id);
  if (it != expectations_.end() && it->second.failed() &&
      it->second.spec.request_id == n.request_id) {
    // Too late to be judged, but a notice follows the sender's flush: none of
    // its puts is still on the way.
    it->second.puts_stopped = true;
    dirty_recvs_.push_back(n.transfer_id);
  }
  if (it == expectations_.end() || it->second.state() != Expectation::State::kReceiving) {
    reject_notice("notice for transfer " + std::to_string(n.transfer_id) +
                  " that is not expected (late, duplicate or expired)");
    if (reply_ep != nullptr) {
      // A transfer this receiver failed on its data says so.
      std::optional<Status> verdict = data_verdict(it, n);
      send_ack(reply_ep, n, verdict.value_or(Status(StatusCode::kAborted, "not expected")));
    }
    return;
  }
  Expectation& e = it->second;
  if (n.request_id != e.spec.request_id || n.layer_begin != e.spec.layer_begin ||
      n.layer_end != e.spec.layer_end || n.num_blocks != e.spec.dst_blocks.size() ||
      n.bytes != e.expected_bytes) {
    reject_notice("notice for transfer " + std::to_string(n.transfer_id) +
                  " does not match its expectation");
    return;
  }
  e.accept_notice(n, reply_ep);
  dirty_recvs_.push_back(n.transfer_id);
}

// Called once the notice is in and every byte has landed.
void TransferEngine::Impl::judge(uint64_t id, Expectation& e) {
  const Notice& n = *e.notice();
  Status verdict;
  if (config_.verify_checksum && (n.flags & kNoticeFlagNoChecksum) != 0) {
    verdict = data_loss("transfer " + std::to_string(id) +
                        " carries no checksum and this receiver verifies");
  } else if (config_.verify_checksum) {
    // Every block was hashed by now: AM and tagged data as it landed,
    // announced copies layer by layer, other puts after the notice.
    if (e.hashes.digest() != n.checksum)
      verdict = data_loss("checksum mismatch on transfer " + std::to_string(id));
  }
  if (verdict.is_ok() && staging_ != nullptr) {
    // Verified in the slots: into the device pool before the ack, so a
    // failed copy fails the sender's side too. Layers verified on their own
    // were copied in already (or are being copied); the rest follow now. The
    // copies run on a thread of their own; until they are done the transfer
    // is kCopyingIn (not judged), so its blocks stay reserved and nothing
    // else is written into them.
    e.start_copy_in();
    std::vector<int32_t> rest;
    for (int32_t layer = e.spec.layer_begin; layer < e.spec.layer_end; ++layer) {
      const auto i = size_t(layer - e.spec.layer_begin);
      if (e.layer_copy_posted[i]) continue;
      e.layer_copy_posted[i] = true;
      rest.push_back(layer);
    }
    if (!rest.empty()) post_copy_in(id, e, std::move(rest));
    if (e.copies_in_flight == 0) conclude(e, e.copy_error);
    return;
  }
  conclude(e, verdict);
}

void TransferEngine::Impl::conclude(Expectation& e, Status verdict) {
  e.conclude(std::move(verdict));
  if (e.reply_ep() != nullptr) send_ack(e.reply_ep(), *e.notice(), e.result());
}

void TransferEngine::Impl::collect_copied_in() {
  if (!has_copied_in_.exchange(false)) return;
  std::vector<CopiedIn> copied;
  {
    std::lock_guard lock(copied_in_mutex_);
    copied.swap(copied_in_);
  }
  for (CopiedIn& c : copied) {
    auto it = expectations_.find(c.transfer_id);
    // Cannot happen: an expectation is released only once its copies are done.
    if (it == expectations_.end() || it->second.serial != c.serial) continue;
    Expectation& e = it->second;
    --e.copies_in_flight;
    if (!c.status.is_ok() && e.copy_error.is_ok()) {
      e.copy_error = c.status.with_context("receive " + std::to_string(c.transfer_id));
      e.fail(e.copy_error);  // while it is still open
    }
    if (e.state() == Expectation::State::kCopyingIn && e.copies_in_flight == 0)
      conclude(e, e.copy_error);
    dirty_recvs_.push_back(c.transfer_id);
  }
}

std::optional<Status> TransferEngine::Impl::data_verdict(
    std::unordered_map<uint64_t, Expectation>::iterator it, const Notice& n) {
  if (it == expectations_.end()) return take_data_verdict(n.transfer_id, n.request_id);
  const Expectation& e = it->second;
  if (e.failed() && e.spec.request_id == n.request_id && failed_on_data(e.result()))
    return e.result();
  return std::nullopt;
}

std::optional<Status> TransferEngine::Impl::take_data_verdict(uint64_t id, uint64_t request_id) {
  auto it = std::find_if(data_verdicts_.begin(), data_verdicts_.end(), [&](const DataVerdict& v) {
    return v.transfer_id == id && v.request_id == request_id;
  });
  if (it == data_verdicts_.end()) return std::nullopt;
  Status verdict = std::move(it->status);
  data_verdicts_.erase(it);
  return verdict;
}

void TransferEngine::Impl::send_ack(ucp_ep_h reply_ep, const Notice& n, const Status& verdict) {
  Notice ack = n;
  ack.kind = WireKind::kAck;
  ack.status_code = uint32_t(verdict.code());
  ack.flags = 0;
  send_control(reply_ep, ack, /*want_reply=*/false, "ack");
}

bool TransferEngine::Impl::send_control(ucp_ep_h ep, const Notice& n, bool want_reply,
                                        const char* what) {
  auto* op = new OpContext{this, n.transfer_id, OpContext::kAck};
  op->header = encode_notice(n);
  ucp_request_param_t param{};
  param.op_attr_mask =
      UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS;
  param.cb.send = ack_callback;
  param.user_data = op;
  param.flags = UCP_AM_SEND_FLAG_EAGER | (want_reply ? UCP_AM_SEND_FLAG_REPLY : 0);
  ucs_status_ptr_t request = post_op(op, ucp_am_send_nbx(ep, kAmControl, op->header.data(),
                                                         op->header.size(), nullptr, 0, &param));
  if (UCS_PTR_IS_ERR(request)) {
    spdlog::warn("kv_transfer[{}]: {} for transfer {} not sent: {}", config_.node_name, what,
                 n.transfer_id, ucs_status_string(UCS_PTR_STATUS(request)));
    return false;
  }
  return true;
}

void TransferEngine::Impl::maybe_finish_recv(uint64_t id) {
  auto it = expectations_.find(id);
  if (it == expectations_.end()) return;
  Expectation& e = it->second;
  if (staging_ != nullptr && config_.verify_checksum && e.open()) copy_in_verified_layers(id, e);
  // Active-message data may still be on its way when the notice arrives (a
  // rendezvous completes on the receiver after the sender's flush); judge once
  // every byte is in. Missing bytes end at the deadline.
  if (e.state() == Expectation::State::kNoticed && e.all_data_landed()) {
    const bool checksummed = e.checksummed(config_.verify_checksum);
    if (checksummed && (e.notice()->flags & kNoticeFlagAmData) == 0) hash_unseen_layers(e);
    if (!checksummed || e.hash_jobs == 0) judge(id, e);
  }
  // Blocks are handed back only when no receive of ours can still write them,
  // nor a put of a sender we granted.
  if (!e.released()) return;
  // Cancelled or expired after its notice came in: the sender awaits an ack.
  if (e.failed() && e.notice() && e.reply_ep() != nullptr)
    send_ack(e.reply_ep(), *e.notice(), e.result());
  const Notice notice = e.notice().value_or(Notice{});
  TransferResult r;
  r.status = e.result();
  r.request_id = e.spec.request_id;
  r.transfer_id = id;
  r.bytes = notice.bytes;
  r.ops = notice.ops;
  r.checksum = notice.checksum;
  r.mode = e.mode();
  r.started = e.started;
  r.finished = Clock::now();
  (r.status.is_ok() ? counters_.receives_ok : counters_.receives_failed)++;
  if (e.cancelled()) {
    spdlog::info("kv_transfer[{}]: receive {} (request {}) cancelled", config_.node_name, id,
                 r.request_id);
  } else if (!r.status.is_ok()) {
    spdlog::warn("kv_transfer[{}]: receive {} (request {}) failed: {}", config_.node_name, id,
                 r.request_id, r.status.to_string());
  }
  // Failed on its data before its sender said anything more (a notice, or
  // that its puts stopped, both answered already): the sender will ask.
  if (e.failed() && !e.notice() && !e.puts_stopped && failed_on_data(r.status)) {
    data_verdicts_.push_back({id, r.request_id, r.status});
    if (data_verdicts_.size() > kKeptDataVerdicts) data_verdicts_.pop_front();
  }
  TransferCallback done = std::move(e.on_done);
  {
    std::lock_guard lock(api_mutex_);
    recv_tickets_.erase(id);
    // Nothing writes or copies its slots any more: free.
    if (staging_ != nullptr) slots_.give_back(e.spec.dst_blocks);
  }
  expectations_.erase(it);
  if (staging_ != nullptr) hand_out_slots();
  done(r);
}

}  // namespace baton::kv_transfer
