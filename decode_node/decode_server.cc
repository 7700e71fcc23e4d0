// decode_node/decode_server.cc — the decode node's loop and request states.
#include "decode_node/decode_server.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <optional>

#include "kv_transfer/wire.h"

namespace baton::decode_node {

Result<std::unique_ptr<DecodeServer>> DecodeServer::create(const node::NodeSettings& settings) {
  BATON_ASSIGN_OR_RETURN(auto runtime, node::NodeRuntime::create(settings));
  return std::unique_ptr<DecodeServer>(new DecodeServer(std::move(runtime)));
}

Status DecodeServer::run(const std::atomic<bool>& stop) {
  while (!stop.load(std::memory_order_relaxed)) {
    for (control::Message& message : runtime_->poll(runtime_->poll_timeout())) handle(message);
    if (runtime_->take_registration_lost()) drop_all();
    for (const auto& result : runtime_->take_completions()) on_transfer(result);
    admit_queued();
    expire_reservations();
    report_queued();
    if (runtime_->step_due()) BATON_RETURN_IF_ERROR(step());
    flush_events();
    runtime_->set_requests(int64_t(requests_.size()));
    runtime_->tick();
  }
  std::vector<uint64_t> ids;
  for (const auto& [id, request] : requests_) ids.push_back(id);
  for (uint64_t id : ids) {
    auto it = requests_.find(id);
    if (it != requests_.end() && !it->second.abandoned)
      end(it->second, FinishReason::kAborted, "the decode node is shutting down");
  }
  flush_events();
  return Status::ok();
}

void DecodeServer::handle(control::Message& message) {
  if (auto* generate = std::get_if<control::Generate>(&message)) {
    on_generate(*generate);
  } else if (auto* done = std::get_if<control::PrefillDone>(&message)) {
    on_prefill_done(*done);
  } else if (auto* abort = std::get_if<control::Abort>(&message)) {
    on_abort(*abort);
  } else {
    spdlog::warn("{}: ignored an unexpected '{}' message", runtime_->settings().name,
                 control::message_type(message));
  }
}

void DecodeServer::on_generate(control::Generate& generate) {
  uint64_t id = generate.request_id;
  if (requests_.contains(id)) {
    spdlog::warn("{}: duplicate request {} ignored", runtime_->settings().name, id);
    return;
  }
  Request& request = requests_[id];
  request.request_id = id;
  request.client_id = generate.client_id;
  request.wants_logprobs = generate.sampling.logprobs > 0;
  spdlog::debug("{}: request {} (#{}): {} prompt tokens, prefilled {}{}", runtime_->settings().name,
                request.client_id, id, generate.prompt.size(),
                generate.prefill_node.empty() ? "here" : "on ", generate.prefill_node);
  const bool here = generate.prefill_node.empty();
  request.prefill_node = generate.prefill_node;
  request.generate = std::move(generate);
  if (here) return start_here(request);
  request.state = State::kQueued;
  queued_.push_back(id);
}

void DecodeServer::start_here(Request& request) {
  control::Generate& generate = request.generate;
  Result<int64_t> sequence = runtime_->engine().scheduler().add(
      std::move(generate.prompt), node::generation_options(generate.sampling));
  generate = {};
  if (!sequence.is_ok()) return end(request, FinishReason::kError, sequence.status().message());
  request.sequence_id = *sequence;
  request.state = State::kRunning;
  by_sequence_[*sequence] = request.request_id;
}

void DecodeServer::prefill_here(Request& request, const std::string& why) {
  spdlog::warn("{}: request {} (#{}): {}; its prompt is computed here", runtime_->settings().name,
               request.client_id, request.request_id, why);
  start_here_once_unwritten(request);
}

void DecodeServer::start_here_once_unwritten(Request& request) {
  if (request.state == State::kQueued) {
    auto queued = std::find(queued_.begin(), queued_.end(), request.request_id);
    if (queued != queued_.end()) queued_.erase(queued);
    return start_here(request);
  }
  if (by_transfer_.contains(request.transfer_id)) {
    // The transfer may still write the blocks: its callback finishes this.
    request.prefill_here = true;
    runtime_->cancel_expect_async(request.transfer_id);
    return;
  }
  // Withdrawn, not aborted: the prompt's admission here counts its prefix
  // lookup, which the reservation counted already.
  runtime_->engine().scheduler().withdraw_reservation(request.sequence_id);
  by_sequence_.erase(request.sequence_id);
  collect_finished();
  request.sequence_id = -1;  // nothing for end() to abort should the scheduler refuse it
  start_here(request);
}

void DecodeServer::admit_queued() {
  while (!queued_.empty()) {
    auto it = requests_.find(queued_.front());
    if (it == requests_.end() || it->second.state != State::kQueued) {
      queued_.pop_front();
      continue;
    }
    const uint64_t id = it->first;
    if (!try_reserve(it->second)) return;  // first come, first served: later ones wait too
    // Reserved, or ended (end() took it off the queue and forgot it).
    if (!queued_.empty() && queued_.front() == id) queued_.pop_front();
  }
}

void DecodeServer::report_queued() {
  int64_t requests = 0, tokens = 0;
  for (uint64_t id : queued_) {
    auto it = requests_.find(id);
    if (it == requests_.end() || it->second.state != State::kQueued) continue;
    ++requests;
    tokens += int64_t(it->second.generate.prompt.size());
  }
  runtime_->set_held(requests, tokens);
}

bool DecodeServer::try_reserve(Request& request) {
  engine::Scheduler& scheduler = runtime_->engine().scheduler();
  control::Generate& generate = request.generate;
  engine::GenerationOptions options = node::generation_options(generate.sampling);
  options.prompt_logprobs = -1;  // the prefill node scores the prompt
  // A staged pool's KV lands in host slots first, one per block that
  // travels: wait for as many as a reservation now would ask for (the
  // blocks past the cached prefix and those its windows skip), or as
  // expect() last refused.
  const int32_t block_size = runtime_->engine().kv_pool().layout().block_size;
  const auto prompt_blocks =
      int32_t((generate.prompt.size() + size_t(block_size) - 1) / block_size);
  const int32_t slots = runtime_->transfer().staging_slots();
  // With room for every block of the prompt free, there is no need to look
  // up what would travel.
  if (slots > 0 && runtime_->transfer().staging_slots_free() < prompt_blocks) {
    const int32_t wanted =
        std::max(scheduler.blocks_to_receive(generate.prompt, options), request.slots_refused);
    if (wanted > slots) {
      // Never fits (the router keeps prompts under max_model_len, which the
      // slots hold; a prompt from elsewhere may not be).
      end(request, FinishReason::kError,
          "a prompt sending " + std::to_string(wanted) + " blocks is more than the " +
              std::to_string(slots) + " staging slots (transfer.staging_blocks) hold");
      return true;
    }
    if (runtime_->transfer().staging_slots_free() < wanted) return false;
  }
  Result<int64_t> sequence = scheduler.reserve_remote(generate.prompt, options);
  if (!sequence.is_ok()) {
    if (sequence.status().code() == StatusCode::kResourceExhausted) return false;
    end(request, FinishReason::kError, sequence.status().message());
    return true;
  }
  request.sequence_id = *sequence;
  request.transfer_id = transfer_id_for(request.request_id);
  if (by_transfer_.contains(request.transfer_id)) {
    scheduler.abort(*sequence);
    collect_finished();
    request.sequence_id = -1;
    end(request, FinishReason::kError, "transfer id collision with a live transfer");
    return true;
  }
  // The blocks the KV is to land in: those after the prefix the prefix
  // cache gave the sequence, which it holds already, and after those its
  // sliding windows let go at once (Scheduler::reserve_remote).
  const engine::Sequence* reserved = scheduler.find(*sequence);
  const int32_t cached = reserved->registered_blocks;
  const int32_t skipped = std::max(0, reserved->block_table.num_released() - cached);
  std::vector<int32_t> blocks(reserved->block_table.blocks().begin() + cached + skipped,
                              reserved->block_table.blocks().end());
  kv_transfer::RecvSpec spec;
  spec.request_id = request.request_id;
  spec.transfer_id = request.transfer_id;
  const auto travelling = int32_t(blocks.size());
  spec.dst_blocks = std::move(blocks);
  spec.deadline = runtime_->settings().kv_wait_timeout;
  request.receive_deadline = std::chrono::steady_clock::now() + *spec.deadline;
  std::vector<int32_t> wire_blocks;
  Status expected =
      runtime_->transfer().expect(std::move(spec), runtime_->completion_sink(), &wire_blocks);
  if (expected.code() == StatusCode::kResourceExhausted) {
    // Fewer slots free than this reservation sends (it found less cached
    // than blocks_to_receive said): wait for them, the reservation made
    // again then (and its prefix lookup counted once).
    scheduler.withdraw_reservation(*sequence);
    request.sequence_id = -1;
    request.slots_refused = travelling;
    return false;
  }
  if (!expected.is_ok()) {
    scheduler.abort(*sequence);
    collect_finished();
    request.sequence_id = -1;
    end(request, FinishReason::kError, "cannot receive KV: " + expected.message());
    return true;
  }
  by_sequence_[*sequence] = request.request_id;
  by_transfer_[request.transfer_id] = request.request_id;
  request.state = State::kAwaitingKv;
  // The prefill node writes the blocks the transfer engine named (a staged
  // pool's slots stand for the pool's blocks).
  runtime_->send(control::PrefillReady{request.request_id, request.transfer_id,
                                       std::move(wire_blocks), cached, skipped});
  return true;
}

void DecodeServer::on_transfer(const kv_transfer::TransferResult& result) {
  auto by = by_transfer_.find(result.transfer_id);
  if (by == by_transfer_.end()) return;
  uint64_t id = by->second;
  by_transfer_.erase(by);
  auto it = requests_.find(id);
  if (it == requests_.end()) return;
  Request& request = it->second;
  // A KV that did not arrive whole is computed here, unless it timed out:
  // the router has given up on the request by then.
  if (!request.abandoned && request.prefill_here) return start_here_once_unwritten(request);
  const bool own_timeout = result.status.code() == StatusCode::kDeadlineExceeded &&
                           std::chrono::steady_clock::now() >= request.receive_deadline;
  if (!request.abandoned && !result.status.is_ok() && !own_timeout) {
    return prefill_here(request, "the KV transfer from " + request.prefill_node +
                                     " failed: " + result.status.message());
  }
  if (request.abandoned || !result.status.is_ok()) {
    // Nothing writes the blocks any more: they can go back to the pool.
    runtime_->engine().scheduler().abort(request.sequence_id);
    by_sequence_.erase(request.sequence_id);
    collect_finished();
    if (request.abandoned) {
      requests_.erase(it);
    } else {
      request.sequence_id = -1;
      end(request, FinishReason::kError,
          "KV transfer from " + request.prefill_node + " failed: " + result.status.message());
    }
    return;
  }
  request.kv_landed = true;
  request.first_token_deadline =
      std::chrono::steady_clock::now() + runtime_->settings().kv_wait_timeout;
  if (request.first_token_known) activate(request);
}

void DecodeServer::expire_reservations() {
  const auto now = std::chrono::steady_clock::now();
  if (now < next_expiry_check_) return;
  next_expiry_check_ = now + std::chrono::milliseconds(100);
  std::vector<uint64_t> expired;
  for (const auto& [id, request] : requests_) {
    if (request.state == State::kAwaitingKv && request.kv_landed && !request.abandoned &&
        !request.first_token_known && now > request.first_token_deadline)
      expired.push_back(id);
  }
  for (uint64_t id : expired) {
    auto it = requests_.find(id);
    if (it != requests_.end())
      end(it->second, FinishReason::kError,
          "no first token from " + it->second.prefill_node +
              " within kv_wait_timeout after its KV landed");
  }
}

void DecodeServer::on_prefill_done(const control::PrefillDone& done) {
  auto it = requests_.find(done.request_id);
  if (it == requests_.end() || it->second.abandoned || it->second.prefill_here) return;
  Request& request = it->second;
  if (!done.error.empty()) {
    // A failed prefill (the router forwards its error, or reports its
    // prefill node dead) may come before this node reserved the request's
    // blocks; a running request fell back here already.
    if (request.state != State::kRunning) prefill_here(request, done.error);
    return;
  }
  if (request.state != State::kAwaitingKv) return;
  request.first_token_known = true;
  request.first_token = done.first_token;
  request.rng_draws = done.rng_draws;
  request.first_logprobs = done.first_logprobs;
  if (request.kv_landed) activate(request);
}

void DecodeServer::activate(Request& request) {
  engine::Scheduler& scheduler = runtime_->engine().scheduler();
  std::optional<engine::OutputLogprobs> first_logprobs;
  if (!request.first_logprobs.empty()) {
    first_logprobs = node::from_wire(request.first_logprobs.front(), request.first_token);
  }
  Result<engine::StepOutput> first =
      scheduler.activate_remote(request.sequence_id, request.first_token, request.rng_draws,
                                first_logprobs ? &*first_logprobs : nullptr);
  if (!first.is_ok()) return end(request, FinishReason::kError, first.status().message());
  request.state = State::kRunning;
  request.generate = {};  // its prompt is the scheduler's now
  uint64_t id = request.request_id;
  bool finished = first->finish_reason != FinishReason::kNone;
  std::vector<control::TokenLogprobs> logprobs;
  if (request.wants_logprobs && first_logprobs) logprobs.push_back(request.first_logprobs.front());
  emit(id, {first->token}, first->finish_reason, "", std::move(logprobs));
  if (finished) {
    by_sequence_.erase(request.sequence_id);
    requests_.erase(id);
    collect_finished();
  }
}

void DecodeServer::on_abort(const control::Abort& abort) {
  auto it = requests_.find(abort.request_id);
  if (it == requests_.end() || it->second.abandoned) return;
  Request& request = it->second;
  spdlog::debug("{}: request {} (#{}) aborted: {}", runtime_->settings().name, request.client_id,
                abort.request_id, abort.reason);
  // The router already ended the request for its client: nothing to tell it.
  if (request.state == State::kQueued) {
    auto queued = std::find(queued_.begin(), queued_.end(), abort.request_id);
    if (queued != queued_.end()) queued_.erase(queued);
    requests_.erase(it);
    return;
  }
  if (request.state == State::kAwaitingKv && !request.kv_landed) {
    request.abandoned = true;
    runtime_->cancel_expect_async(request.transfer_id);  // NotFound: its callback is queued
    return;
  }
  runtime_->engine().scheduler().abort(request.sequence_id);
  by_sequence_.erase(request.sequence_id);
  requests_.erase(it);
  collect_finished();
}

void DecodeServer::drop_all() {
  if (requests_.empty()) return;
  spdlog::warn("{}: the router lost this node's registration: dropping its {} requests",
               runtime_->settings().name, requests_.size());
  std::vector<uint64_t> ids;
  for (const auto& [id, request] : requests_) ids.push_back(id);
  for (uint64_t id : ids) on_abort(control::Abort{id, "the router lost this node's registration"});
  // Their events would only reach a router that does not know them.
  events_.events.clear();
  pending_event_.clear();
}

Status DecodeServer::step() {
  engine::Scheduler& scheduler = runtime_->engine().scheduler();
  std::vector<engine::StepOutput> outputs;
  runtime_->begin_step();
  Status status = scheduler.step(&outputs);
  if (!status.is_ok()) {
    spdlog::error("{}: step failed: {}", runtime_->settings().name, status.to_string());
    return status;
  }
  runtime_->count_step();
  // Sequences that finished this step have left the scheduler: keep them for
  // their last token's log-probabilities.
  std::unordered_map<int64_t, std::unique_ptr<engine::Sequence>> finished;
  for (auto& sequence : scheduler.take_finished()) {
    int64_t sequence_id = sequence->id;
    finished[sequence_id] = std::move(sequence);
  }
  for (const engine::StepOutput& output : outputs) {
    auto by = by_sequence_.find(output.sequence_id);
    if (by == by_sequence_.end()) continue;
    uint64_t id = by->second;
    auto it = requests_.find(id);
    auto done = finished.find(output.sequence_id);
    const engine::Sequence* sequence =
        done != finished.end() ? done->second.get() : scheduler.find(output.sequence_id);
    std::vector<control::TokenLogprobs> logprobs;
    if (it != requests_.end() && it->second.wants_logprobs && sequence != nullptr &&
        !sequence->output_logprobs.empty()) {
      logprobs.push_back(node::to_wire(sequence->output_logprobs.back()));
    }
    bool is_finished = output.finish_reason != FinishReason::kNone;
    control::TokenEvent& event =
        emit(id, {output.token}, output.finish_reason, "", std::move(logprobs));
    if (output.prefill_seconds >= 0) {  // the prompt was computed here
      event.queue_seconds = float(output.queue_seconds);
      event.prefill_seconds = float(output.prefill_seconds);
      if (sequence != nullptr) {
        event.cached_tokens = sequence->cached_prompt_tokens;
        for (const engine::OutputLogprobs& scored : sequence->prompt_logprobs)
          event.prompt_logprobs.push_back(node::to_wire(scored));
      }
    }
    if (is_finished) {
      if (it != requests_.end())
        spdlog::debug("{}: request {} (#{}) finished: {}", runtime_->settings().name,
                      it->second.client_id, id, engine::finish_reason_name(output.finish_reason));
      by_sequence_.erase(by);
      requests_.erase(id);
    }
  }
  return Status::ok();
}

void DecodeServer::collect_finished() {
  // Finished sequences already gave their blocks back; drop them.
  (void)runtime_->engine().scheduler().take_finished();
}

void DecodeServer::end(Request& request, FinishReason finish_reason, std::string error) {
  uint64_t id = request.request_id;
  if (finish_reason == FinishReason::kError)
    spdlog::warn("{}: request {} (#{}) failed: {}", runtime_->settings().name, request.client_id,
                 id, error);
  emit(id, {}, finish_reason, std::move(error));
  if (request.state == State::kAwaitingKv && !request.kv_landed &&
      by_transfer_.contains(request.transfer_id)) {
    // A transfer may still write the blocks: free them in its callback
    // (one that called back already is off by_transfer_).
    request.abandoned = true;
    runtime_->cancel_expect_async(request.transfer_id);
    return;
  }
  if (request.sequence_id >= 0) {
    runtime_->engine().scheduler().abort(request.sequence_id);
    by_sequence_.erase(request.sequence_id);
    collect_finished();
  }
  if (request.state == State::kQueued) {
    auto queued = std::find(queued_.begin(), queued_.end(), id);
    if (queued != queued_.end()) queued_.erase(queued);
  }
  requests_.erase(id);
}

control::TokenEvent& DecodeServer::emit(uint64_t request_id, std::vector<int32_t> tokens,
                                        FinishReason finish_reason, std::string error,
                                        std::vector<control::TokenLogprobs> logprobs) {
  auto pending = pending_event_.find(request_id);
  if (pending != pending_event_.end()) {
    control::TokenEvent& event = events_.events[pending->second];
    event.tokens.insert(event.tokens.end(), tokens.begin(), tokens.end());
    for (auto& entry : logprobs) event.logprobs.push_back(std::move(entry));
    if (finish_reason != FinishReason::kNone) {
      event.finish_reason = finish_reason;
      event.error = std::move(error);
    }
    return event;
  }
  pending_event_[request_id] = events_.events.size();
  control::TokenEvent& event = events_.events.emplace_back();
  event.request_id = request_id;
  event.tokens = std::move(tokens);
  event.finish_reason = finish_reason;
  event.error = std::move(error);
  event.logprobs = std::move(logprobs);
  return event;
}

void DecodeServer::flush_events() {
  if (events_.events.empty()) return;
  for (const control::Events& frame : control::split_events(std::move(events_.events)))
    runtime_->send(frame);
  events_.events.clear();
  pending_event_.clear();
}

uint64_t DecodeServer::transfer_id_for(uint64_t request_id) {
  // Transfer ids travel in 32 bits of a UCX tag, 0 unused, and must be unique
  // on the sending prefill node too, which serves many decode nodes: derive
  // them from the router's cluster-wide sequential request ids.
  return request_id % kv_transfer::kMaxTransferId + 1;
}

}  // namespace baton::decode_node
