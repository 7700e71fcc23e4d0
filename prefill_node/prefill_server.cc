// prefill_node/prefill_server.cc — the prefill node's loop and jobs.
#include "prefill_node/prefill_server.h"

#include <spdlog/spdlog.h>

#include <algorithm>

namespace baton::prefill_node {

Result<std::unique_ptr<PrefillServer>> PrefillServer::create(const node::NodeSettings& settings) {
  BATON_ASSIGN_OR_RETURN(auto runtime, node::NodeRuntime::create(settings));
  std::unique_ptr<PrefillServer> server(new PrefillServer(std::move(runtime)));
  PrefillServer* self = server.get();
  server->runtime_->set_kv_paths_source([self] {
    std::map<std::string, std::string> paths;
    for (const auto& [decode_node, peer] : self->peers_) {
      std::string path = self->runtime_->transfer().peer_path(peer.id);
      if (!path.empty()) paths.emplace(decode_node, std::move(path));
    }
    return paths;
  });
  // Only a prompt's last chunk streams its KV, layer by layer: the steps
  // without one are not reported (a GPU would wait for each layer).
  server->runtime_->engine().scheduler().set_layer_observer(
      [self](int32_t layer, std::span<const engine::StepSequenceInfo> step) {
        self->on_layer(layer, step);
      },
      [self](std::span<const engine::StepSequenceInfo> step) {
        return std::ranges::any_of(step, [self](const engine::StepSequenceInfo& info) {
          return self->streaming_job(info) != nullptr;
        });
      });
  return server;
}

Status PrefillServer::run(const std::atomic<bool>& stop) {
  engine::Scheduler& scheduler = runtime_->engine().scheduler();
  while (!stop.load(std::memory_order_relaxed)) {
    for (control::Message& message : runtime_->poll(runtime_->poll_timeout())) handle(message);
    if (runtime_->take_registration_lost()) drop_all();
    for (const auto& result : runtime_->take_completions()) on_transfer(result);
    admit_held();
    runtime_->set_requests(int64_t(jobs_.size() + held_.size()));
    if (runtime_->step_due()) {
      runtime_->begin_step();
      Status status = scheduler.step(nullptr);
      if (!status.is_ok()) {
        spdlog::error("{}: step failed: {}", runtime_->settings().name, status.to_string());
        return status;
      }
      runtime_->count_step();
      collect_finished();
    }
    runtime_->tick();
  }
  return Status::ok();
}

void PrefillServer::handle(control::Message& message) {
  if (auto* info = std::get_if<control::PeerInfo>(&message)) {
    on_peer_info(*info);
  } else if (auto* prefill = std::get_if<control::Prefill>(&message)) {
    on_prefill(*prefill);
  } else if (auto* abort = std::get_if<control::Abort>(&message)) {
    on_abort(*abort);
  } else {
    spdlog::warn("{}: ignored an unexpected '{}' message", runtime_->settings().name,
                 control::message_type(message));
  }
}

void PrefillServer::on_peer_info(const control::PeerInfo& info) {
  // The router sends a decode node's pool again whenever that node
  // registers (a router restart, a node's): the same pool keeps its
  // endpoint; a new one (the node restarted) replaces the old.
  auto known = peers_.find(info.node);
  if (known != peers_.end()) {
    if (known->second.descriptor == info.descriptor) return;
    runtime_->transfer().remove_peer(known->second.id);
    peers_.erase(known);
  }
  Result<kv_transfer::PeerId> peer = runtime_->transfer().add_peer(info.descriptor);
  if (!peer.is_ok()) {
    spdlog::error("{}: cannot use decode node {}: {}", runtime_->settings().name, info.node,
                  peer.status().message());
    peers_.erase(info.node);
    refused_peers_[info.node] = peer.status().message();
    return;
  }
  refused_peers_.erase(info.node);
  peers_[info.node] = {*peer, info.descriptor};
}

void PrefillServer::on_prefill(control::Prefill& prefill) {
  uint64_t id = prefill.request_id;
  if (jobs_.contains(id) || std::ranges::any_of(held_, [id](const control::Prefill& held) {
        return held.request_id == id;
      })) {
    spdlog::warn("{}: duplicate prefill {} ignored", runtime_->settings().name, id);
    return;
  }
  if (!peers_.contains(prefill.decode_node)) return fail_unknown_peer(prefill);
  int32_t prompt_len = int32_t(prefill.prompt.size());
  int32_t block_size = runtime_->engine().kv_pool().layout().block_size;
  size_t blocks_needed = size_t((prompt_len + block_size - 1) / block_size);
  // The decode node holds the first cached_blocks already, and its windows
  // will not read the next skipped_blocks; at least the block of the last
  // token always travels.
  if (prefill.dst_blocks.empty() ||
      size_t(prefill.cached_blocks) + size_t(prefill.skipped_blocks) + prefill.dst_blocks.size() !=
          blocks_needed) {
    return fail(id, prefill.client_id,
                std::to_string(prefill.dst_blocks.size()) + " destination blocks after " +
                    std::to_string(prefill.cached_blocks) + " cached and " +
                    std::to_string(prefill.skipped_blocks) + " skipped ones for a " +
                    std::to_string(prompt_len) + "-token prompt of " +
                    std::to_string(blocks_needed) + " blocks");
  }
  const int32_t slots = runtime_->transfer().staging_slots();
  if (slots == 0) return start(prefill);
  if (prefill.dst_blocks.size() > size_t(slots)) {
    return fail(id, prefill.client_id,
                "a prompt that sends " + std::to_string(prefill.dst_blocks.size()) +
                    " blocks is more than the " + std::to_string(slots) +
                    " staging slots (transfer.staging_blocks) hold");
  }
  held_.push_back(std::move(prefill));
  admit_held();
}

void PrefillServer::admit_held() {
  const int64_t slots = runtime_->transfer().staging_slots();
  while (!held_.empty() && slots_committed_ + int64_t(held_.front().dst_blocks.size()) <= slots) {
    control::Prefill prefill = std::move(held_.front());
    held_.pop_front();
    start(prefill);
  }
  int64_t held_tokens = 0;
  for (const control::Prefill& prefill : held_) held_tokens += int64_t(prefill.prompt.size());
  runtime_->set_held(int64_t(held_.size()), held_tokens);
}

void PrefillServer::start(control::Prefill& prefill) {
  const uint64_t id = prefill.request_id;
  auto peer = peers_.find(prefill.decode_node);
  if (peer == peers_.end()) return fail_unknown_peer(prefill);  // gone while it was held
  const auto prompt_len = int32_t(prefill.prompt.size());
  engine::GenerationOptions options = node::generation_options(prefill.sampling);
  options.max_tokens = 1;        // the first token; the decode node samples the rest
  options.retain_blocks = true;  // until the transfer out of them completes
  options.retained_from_block = prefill.cached_blocks + prefill.skipped_blocks;
  Result<int64_t> sequence = runtime_->engine().scheduler().add(std::move(prefill.prompt), options);
  if (!sequence.is_ok()) return fail(id, prefill.client_id, sequence.status().message());
  spdlog::debug("{}: request {} (#{}): prefilling {} tokens for {}", runtime_->settings().name,
                prefill.client_id, id, prompt_len, prefill.decode_node);
  Job& job = jobs_[id];
  // A staged pool's send holds a slot per block it sends until its
  // callback, which comes before the job ends.
  if (runtime_->transfer().staging_slots() > 0) job.slots = int32_t(prefill.dst_blocks.size());
  slots_committed_ += job.slots;
  job.prefill = std::move(prefill);
  job.prompt_len = prompt_len;
  job.sequence_id = *sequence;
  job.peer = peer->second.id;
  by_sequence_[*sequence] = id;
}

void PrefillServer::fail_unknown_peer(const control::Prefill& prefill) {
  auto refused = refused_peers_.find(prefill.decode_node);
  if (refused != refused_peers_.end()) {
    return fail(prefill.request_id, prefill.client_id,
                "cannot send KV to decode node '" + prefill.decode_node + "': " + refused->second);
  }
  fail(prefill.request_id, prefill.client_id,
       "no KV pool known for decode node '" + prefill.decode_node + "'");
}

PrefillServer::Job* PrefillServer::streaming_job(const engine::StepSequenceInfo& info) {
  auto by = by_sequence_.find(info.sequence_id);
  if (by == by_sequence_.end()) return nullptr;
  auto found = jobs_.find(by->second);
  if (found == jobs_.end()) return nullptr;
  Job& job = found->second;
  if (job.aborted || job.transfer_done || info.start_position + info.num_tokens != job.prompt_len)
    return nullptr;
  return &job;
}

void PrefillServer::on_layer(int32_t layer, std::span<const engine::StepSequenceInfo> step) {
  engine::Scheduler& scheduler = runtime_->engine().scheduler();
  for (const engine::StepSequenceInfo& info : step) {
    Job* streaming = streaming_job(info);
    if (streaming == nullptr) continue;
    Job& job = *streaming;
    uint64_t transfer_id = job.prefill.transfer_id;
    if (!job.transfer_started) {
      const engine::Sequence* sequence = scheduler.find(info.sequence_id);
      kv_transfer::SendSpec spec;
      spec.request_id = job.prefill.request_id;
      spec.transfer_id = transfer_id;
      spec.dst_blocks = job.prefill.dst_blocks;
      // The prompt's blocks past those the decode node holds or skips.
      const std::vector<int32_t>& blocks = sequence->block_table.blocks();
      const auto first = blocks.begin() + job.prefill.cached_blocks + job.prefill.skipped_blocks;
      spec.src_blocks.assign(first, first + std::ptrdiff_t(spec.dst_blocks.size()));
      Status begun =
          runtime_->transfer().begin_send(job.peer, std::move(spec), runtime_->completion_sink());
      if (!begun.is_ok()) {
        job.transfer_done = true;
        job.transfer_status = begun;
        continue;
      }
      job.transfer_started = true;
      by_transfer_[transfer_id] = job.prefill.request_id;
    }
    Status posted = runtime_->transfer().post_layers(transfer_id, layer + 1);
    if (!posted.is_ok()) {
      spdlog::warn("{}: transfer {}: {}", runtime_->settings().name, transfer_id, posted.message());
      runtime_->cancel_send_async(transfer_id);
    }
  }
}

void PrefillServer::on_transfer(const kv_transfer::TransferResult& result) {
  auto by = by_transfer_.find(result.transfer_id);
  if (by == by_transfer_.end()) return;
  uint64_t id = by->second;
  by_transfer_.erase(by);
  auto it = jobs_.find(id);
  if (it == jobs_.end()) return;
  it->second.transfer_done = true;
  it->second.transfer_status = result.status;
  maybe_complete(id);
}

void PrefillServer::collect_finished() {
  engine::Scheduler& scheduler = runtime_->engine().scheduler();
  for (auto& sequence : scheduler.take_finished()) {
    auto by = by_sequence_.find(sequence->id);
    if (by == by_sequence_.end()) {
      scheduler.release_blocks(*sequence);
      continue;
    }
    uint64_t id = by->second;
    by_sequence_.erase(by);
    jobs_[id].finished = std::move(sequence);
    maybe_complete(id);
  }
}

void PrefillServer::maybe_complete(uint64_t request_id) {
  auto it = jobs_.find(request_id);
  if (it == jobs_.end()) return;
  Job& job = it->second;
  if (!job.finished) return;
  if (job.transfer_started && !job.transfer_done) return;  // UCX may still read the blocks
  runtime_->engine().scheduler().release_blocks(*job.finished);
  if (!job.aborted) {
    control::PrefillDone done;
    done.request_id = request_id;
    if (!job.transfer_status.is_ok()) {
      done.error = "KV transfer failed: " + job.transfer_status.message();
    } else if (!job.transfer_started || job.finished->output.empty()) {
      done.error = "the prefill ended without its KV transfer";
    }
    if (!done.error.empty()) {
      spdlog::warn("{}: request {} (#{}): {}", runtime_->settings().name, job.prefill.client_id,
                   request_id, done.error);
    } else {
      spdlog::debug("{}: request {} (#{}): prefilled, KV sent", runtime_->settings().name,
                    job.prefill.client_id, request_id);
      done.first_token = job.finished->output.front();
      done.queue_seconds = float(job.finished->queue_seconds);
      done.prefill_seconds = float(job.finished->prefill_seconds);
      done.cached_tokens = job.finished->cached_prompt_tokens;
      done.rng_draws = job.finished->rng.draws();
      if (!job.finished->output_logprobs.empty()) {
        done.first_logprobs.push_back(node::to_wire(job.finished->output_logprobs.front()));
      }
      for (const engine::OutputLogprobs& scored : job.finished->prompt_logprobs)
        done.prompt_logprobs.push_back(node::to_wire(scored));
    }
    runtime_->send(done);
  }
  slots_committed_ -= job.slots;
  jobs_.erase(it);
}

void PrefillServer::on_abort(const control::Abort& abort) {
  if (std::erase_if(held_, [&](const control::Prefill& held) {
        return held.request_id == abort.request_id;
      }) > 0) {
    return admit_held();  // the others' turn may have come
  }
  auto it = jobs_.find(abort.request_id);
  if (it == jobs_.end()) return;
  Job& job = it->second;
  job.aborted = true;
  if (!job.finished) runtime_->engine().scheduler().abort(job.sequence_id);
  if (job.transfer_started && !job.transfer_done)
    runtime_->cancel_send_async(job.prefill.transfer_id);
  collect_finished();
  maybe_complete(abort.request_id);
}

void PrefillServer::drop_all() {
  if (jobs_.empty() && held_.empty()) return;
  spdlog::warn("{}: the router lost this node's registration: dropping its {} prefills",
               runtime_->settings().name, jobs_.size() + held_.size());
  held_.clear();
  admit_held();  // reports none held
  std::vector<uint64_t> ids;
  for (const auto& [id, job] : jobs_) ids.push_back(id);
  for (uint64_t id : ids) on_abort(control::Abort{id, "the router lost this node's registration"});
}

void PrefillServer::fail(uint64_t request_id, const std::string& client_id,
                         const std::string& error) {
  spdlog::warn("{}: request {} (#{}): prefill failed: {}", runtime_->settings().name, client_id,
               request_id, error);
  control::PrefillDone done;
  done.request_id = request_id;
  done.error = error;
  runtime_->send(done);
}

}  // namespace baton::prefill_node
