// node/node_runtime.cc — engine, transfer engine and control socket of a node.
#include "node/node_runtime.h"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>

#include "engine/host_memory.h"
#include "engine/window_budget.h"

namespace baton::node {

using namespace std::chrono_literals;

// How often an unregistered node repeats its Register.
constexpr auto kRegisterRetry = 500ms;
// Longest the loop sleeps when it has nothing to compute.
constexpr auto kIdlePoll = 20ms;

engine::GenerationOptions generation_options(const control::SamplingSpec& sampling) {
  engine::GenerationOptions options;
  options.sampling.temperature = sampling.temperature;
  options.sampling.top_p = sampling.top_p;
  options.sampling.top_k = sampling.top_k;
  options.seed = sampling.seed;
  options.max_tokens = sampling.max_tokens;
  options.stop_token_ids = sampling.stop_token_ids;
  options.ignore_eos = sampling.ignore_eos;
  options.logprobs = sampling.logprobs;
  options.prompt_logprobs = sampling.prompt_logprobs;
  options.sampling.min_p = sampling.min_p;
  options.min_tokens = sampling.min_tokens;
  auto& adj = options.adjustments;
  adj.presence_penalty = sampling.presence_penalty;
  adj.frequency_penalty = sampling.frequency_penalty;
  adj.repetition_penalty = sampling.repetition_penalty;
  for (size_t i = 0; i < sampling.logit_bias_ids.size(); ++i) {
    adj.logit_bias.emplace_back(sampling.logit_bias_ids[i], sampling.logit_bias_values[i]);
  }
  return options;
}

control::TokenLogprobs to_wire(const engine::OutputLogprobs& logprobs) {
  control::TokenLogprobs out;
  out.logprob = logprobs.logprob;
  for (const auto& top : logprobs.top) {
    out.top_ids.push_back(top.id);
    out.top_logprobs.push_back(top.logprob);
  }
  return out;
}

engine::OutputLogprobs from_wire(const control::TokenLogprobs& logprobs, int32_t token) {
  engine::OutputLogprobs out;
  out.id = token;
  out.logprob = logprobs.logprob;
  for (size_t i = 0; i < logprobs.top_ids.size() && i < logprobs.top_logprobs.size(); ++i) {
    out.top.push_back({logprobs.top_ids[i], logprobs.top_logprobs[i]});
  }
  return out;
}

namespace {

// The slots a staged pool's transfers pass through: transfer.staging_blocks,
// or by default room for two of the longest transfers or 1 GiB, whichever
// is more; never more than the pool has blocks (its transfers cannot hold
// more). Fewer than the longest transfer's blocks (`longest_tokens`: a
// max_model_len prompt's, or what its sliding windows reach) could never
// carry it.
Result<int32_t> staging_blocks(const NodeSettings& settings, const KvLayout& pool,
                               int32_t longest_tokens) {
  const int32_t set = settings.transfer.staging_blocks;
  BATON_RETURN_IF_ERROR(kv_transfer::check_staging_blocks(set, longest_tokens, pool.block_size,
                                                          "transfer.staging_blocks"));
  if (set > 0) return std::min(set, pool.num_blocks);
  const int64_t longest = (int64_t(longest_tokens) + pool.block_size - 1) / pool.block_size;
  const uint64_t slot_bytes = uint64_t(pool.block_bytes()) * uint64_t(pool.num_layers);
  const int64_t in_a_gib = int64_t((uint64_t(1) << 30) / std::max<uint64_t>(slot_bytes, 1));
  return int32_t(std::min<int64_t>(pool.num_blocks, std::max(2 * longest, in_a_gib)));
}

}  // namespace

Result<std::unique_ptr<NodeRuntime>> NodeRuntime::create(const NodeSettings& settings) {
  std::unique_ptr<NodeRuntime> node(new NodeRuntime(settings));
  kv_transfer::TransferConfig transfer_config = settings.transfer;
  transfer_config.node_name = settings.name;
  // A pool UCX cannot register (a device's) travels through host slots.
  const bool device_pool = settings.engine.device.is_cuda();
  const bool staged = device_pool || settings.stage_host_pool;
  if (staged) {
    transfer_config.share_pool = false;
    transfer_config.pool_memory =
        device_pool ? kv_transfer::PoolMemory::kCuda : kv_transfer::PoolMemory::kHost;
  }
  // Shared: the transfer engine is built first and UCX allocates the pool
  // the engine then adopts (the destructor stops the transfer engine before
  // the engine goes, and the engine never touches the pool on its way out).
  engine::KvPoolAllocator allocate_pool;
  if (transfer_config.share_pool) {
    allocate_pool = [&](const KvLayout& layout) -> Result<void*> {
      BATON_ASSIGN_OR_RETURN(node->transfer_,
                             kv_transfer::TransferEngine::create(transfer_config, layout, nullptr,
                                                                 layout.total_bytes()));
      return node->transfer_->pool();
    };
  }
  {
    BATON_ASSIGN_OR_RETURN(
        node->engine_, engine::Engine::create(settings.model_dir, settings.engine, allocate_pool));
  }
  engine::KvPool& pool = node->engine_->kv_pool();
  if (node->transfer_ == nullptr) {
    std::unique_ptr<PoolCopier> staging;
    if (staged) {
      BATON_ASSIGN_OR_RETURN(
          transfer_config.staging_blocks,
          staging_blocks(settings, pool.layout(),
                         int32_t(engine::tokens_sent_at_most(
                             node->engine_->scheduler().max_model_len(),
                             node->engine_->scheduler().kv_window(), pool.layout().block_size))));
      const uint64_t slot_bytes = uint64_t(transfer_config.staging_blocks) *
                                  pool.layout().block_bytes() * uint64_t(pool.layout().num_layers);
      // Pinned host memory, besides what the process holds already.
      BATON_RETURN_IF_ERROR(engine::check_fits_host_memory(
          slot_bytes, "transfer.staging_blocks: the " +
                          std::to_string(transfer_config.staging_blocks) + " host slots (" +
                          engine::gib_text(slot_bytes) + ") through which the KV pool on " +
                          settings.engine.device.name() + " meets the wire"));
      BATON_ASSIGN_OR_RETURN(staging, node->engine_->make_pool_copier());
    }
    BATON_ASSIGN_OR_RETURN(node->transfer_, kv_transfer::TransferEngine::create(
                                                transfer_config, pool.layout(), pool.data(),
                                                pool.bytes(), std::move(staging)));
  }
  {
    BATON_ASSIGN_OR_RETURN(
        node->socket_,
        control::ControlSocket::connect(settings.control_endpoint, settings.name,
                                        settings.control_keys ? &*settings.control_keys : nullptr));
  }
  {
    BATON_ASSIGN_OR_RETURN(node->heartbeat_socket_,
                           control::ControlSocket::connect(
                               settings.control_endpoint,
                               settings.name + std::string(control::kHeartbeatIdentitySuffix),
                               settings.control_keys ? &*settings.control_keys : nullptr));
  }
  node->cancel_thread_ = std::thread([n = node.get()] { n->cancel_loop(); });
  node->heartbeat_thread_ = std::thread([n = node.get()] { n->heartbeat_loop(); });
  spdlog::info("{}: {} node up, KV pool {} blocks of {} tokens, transports {}", settings.name,
               role_name(settings.role), pool.layout().num_blocks, pool.layout().block_size,
               fmt::join(node->transfer_->transports(), ","));
  return node;
}

// The transfer engine fails what is unfinished through completion_sink(),
// which needs the mutex and wake fd: stop it while they still exist.
NodeRuntime::~NodeRuntime() {
  heartbeat_stop_ = true;
  if (heartbeat_thread_.joinable()) heartbeat_thread_.join();
  {
    std::lock_guard lock(cancel_mutex_);
    cancel_stop_ = true;
  }
  cancel_wakeup_.notify_all();
  if (cancel_thread_.joinable()) cancel_thread_.join();
  transfer_.reset();
}

void NodeRuntime::cancel_expect_async(uint64_t transfer_id) {
  {
    std::lock_guard lock(cancel_mutex_);
    cancels_.push_back({transfer_id, false});
  }
  cancel_wakeup_.notify_one();
}

void NodeRuntime::cancel_send_async(uint64_t transfer_id) {
  {
    std::lock_guard lock(cancel_mutex_);
    cancels_.push_back({transfer_id, true});
  }
  cancel_wakeup_.notify_one();
}

void NodeRuntime::cancel_loop() {
  std::unique_lock lock(cancel_mutex_);
  while (true) {
    cancel_wakeup_.wait(lock, [&] { return cancel_stop_ || !cancels_.empty(); });
    if (cancel_stop_) return;
    Cancel cancel = cancels_.front();
    cancels_.pop_front();
    lock.unlock();
    // NotFound: the transfer already ended; its callback reports how.
    Status status = cancel.send ? transfer_->cancel_send(cancel.transfer_id)
                                : transfer_->cancel_expect(cancel.transfer_id);
    if (!status.is_ok() && status.code() != StatusCode::kNotFound) {
      spdlog::warn("{}: cancelling transfer {}: {}", settings_.name, cancel.transfer_id,
                   status.message());
    }
    lock.lock();
  }
}

void NodeRuntime::send(const control::Message& message) {
  Status status = socket_->send("", message);
  if (!status.is_ok()) {
    ++send_failures_;
    spdlog::warn("{}: {} not sent: {}", settings_.name, control::message_type(message),
                 status.message());
  }
}

void NodeRuntime::send_register() {
  control::Register reg;
  reg.node = settings_.name;
  reg.role = settings_.role;
  reg.descriptor = transfer_->descriptor();
  reg.block_size = engine_->kv_pool().layout().block_size;
  reg.max_model_len = engine_->scheduler().max_model_len();
  reg.pid = ::getpid();
  reg.kv_dtype = std::string(dtype_name(engine_->kv_pool().layout().dtype));
  reg.kv_bytes_per_token = int64_t(engine_->kv_pool().layout().bytes_per_token());
  reg.device = settings_.engine.device.name();
  reg.kv_staging = transfer_->staging();
  reg.weights_bytes = int64_t(engine_->model().backend().weights_bytes());
  reg.kv_pool_bytes = int64_t(engine_->kv_pool().bytes());
  reg.prefix_caching = settings_.engine.enable_prefix_caching;
  send(reg);
  next_register_ = std::chrono::steady_clock::now() + kRegisterRetry;
}

std::vector<control::Message> NodeRuntime::poll(std::chrono::milliseconds timeout) {
  std::vector<control::Message> out;
  {
    std::lock_guard lock(completions_mutex_);
    if (!completions_.empty()) timeout = 0ms;
  }
  for (auto& received : socket_->poll(timeout, wake_.fd())) {
    if (auto* ack = std::get_if<control::RegisterAck>(&received.message)) {
      const control::NodeRegistration::Outcome outcome = registration_.on_ack(*ack);
      if (outcome.welcomed) spdlog::info("{}: registered with the router", settings_.name);
      if (outcome.refused) {
        if (ack->message != last_refusal_)
          spdlog::warn("{}: router: {}", settings_.name, ack->message);
        last_refusal_ = ack->message;
      }
      if (outcome.lost) {
        registration_lost_ = true;
        next_register_ = {};  // register again at the next tick
      }
      if (ack->accepted) last_refusal_.clear();
      continue;
    }
    if (auto* rejected = std::get_if<control::Rejected>(&received.message)) {
      // The router could not read a frame of this node's: a version
      // mismatch or a bug, which the router's side fails at once.
      spdlog::error("{}: the router refused this node's '{}' message (request {}): {}",
                    settings_.name, rejected->type, rejected->request_id, rejected->reason);
      continue;
    }
    out.push_back(std::move(received.message));
  }
  wake_.drain();
  return out;
}

void NodeRuntime::tick() {
  auto now = std::chrono::steady_clock::now();
  came_round_ns_.store(now.time_since_epoch().count(), std::memory_order_relaxed);
  if (!registration_.registered() && now >= next_register_) send_register();
  // Heartbeats read the load every interval: publishing it a few times per
  // interval keeps it fresh without taking stats on every engine step.
  if (now < next_publish_) return;
  next_publish_ = now + settings_.heartbeat_interval / 4;
  control::NodeLoad current = load();
  std::map<std::string, std::string> paths;
  if (kv_paths_source_) paths = kv_paths_source_();
  std::lock_guard lock(load_mutex_);
  published_load_ = current;
  published_kv_paths_ = std::move(paths);
}

bool NodeRuntime::loop_alive() {
  if (settings_.stall_timeout <= 0ms) return true;
  const auto since = std::chrono::steady_clock::now().time_since_epoch() -
                     std::chrono::steady_clock::duration(came_round_ns_.load());
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(since).count();
  const bool alive = since <= settings_.stall_timeout;
  if (!alive && !stall_reported_) {
    spdlog::error(
        "{}: the node's loop has not come round in {} ms (router.node_stall_timeout_ms {}): "
        "heartbeats stop, so that the router fails this node's requests",
        settings_.name, ms, settings_.stall_timeout.count());
  } else if (alive && stall_reported_) {
    spdlog::warn("{}: the node's loop came round again; heartbeats resume", settings_.name);
  }
  stall_reported_ = !alive;
  return alive;
}

void NodeRuntime::heartbeat_loop() {
  came_round_ns_.store(std::chrono::steady_clock::now().time_since_epoch().count());
  while (!heartbeat_stop_.load()) {
    // Waiting on the socket doubles as the interval's sleep; the router
    // never writes to this identity.
    (void)heartbeat_socket_->poll(settings_.heartbeat_interval);
    if (heartbeat_stop_.load() || !loop_alive() || !registration_.registered()) continue;
    control::Heartbeat heartbeat{settings_.name, {}, {}, registration_.number()};
    {
      std::lock_guard lock(load_mutex_);
      heartbeat.load = published_load_;
      heartbeat.kv_paths = published_kv_paths_;
    }
    Status sent = heartbeat_socket_->send("", heartbeat);
    if (!sent.is_ok()) spdlog::warn("{}: heartbeat not sent: {}", settings_.name, sent.message());
  }
}

void NodeRuntime::count_step() {
  const engine::StepTokenCounts& step = engine_->scheduler().last_step();
  prompt_tokens_ += step.prompt_tokens;
  generation_tokens_ += step.generated_tokens;
  stalled_ = step.prompt_tokens + step.recomputed_tokens + step.generated_tokens == 0;
}

bool NodeRuntime::step_due() const {
  return engine_->scheduler().has_work() && std::chrono::steady_clock::now() >= next_step_at_;
}

void NodeRuntime::begin_step() {
  if (const auto stall = std::exchange(settings_.fault_first_step_stall, 0ms); stall > 0ms) {
    spdlog::warn("{}: fault injection: the first step waits {} ms", settings_.name, stall.count());
    std::this_thread::sleep_for(stall);
  }
  next_step_at_ = std::chrono::steady_clock::now() + settings_.engine.min_step_interval;
}

std::chrono::milliseconds NodeRuntime::poll_timeout() const {
  if (!engine_->scheduler().has_work() || stalled_) return kIdlePoll;
  const auto wait = next_step_at_ - std::chrono::steady_clock::now();
  return wait > 0ms ? std::chrono::ceil<std::chrono::milliseconds>(wait) : 0ms;
}

control::NodeLoad NodeRuntime::load() const {
  engine::SchedulerStats stats = engine_->scheduler().stats();
  kv_transfer::EngineStats transfers = transfer_->stats();
  control::NodeLoad load;
  load.running = stats.running;
  load.waiting = stats.waiting + held_requests_;
  load.awaiting_kv = stats.awaiting;
  load.requests = requests_;
  load.waiting_tokens = stats.waiting_tokens + held_tokens_;
  load.free_blocks = stats.free_blocks;
  load.total_blocks = stats.total_blocks;
  load.prompt_tokens = prompt_tokens_;
  load.generation_tokens = generation_tokens_;
  load.preemptions = stats.preemptions;
  load.transfers_ok = int64_t(transfers.sends_ok + transfers.receives_ok);
  load.transfers_failed = int64_t(transfers.sends_failed + transfers.receives_failed);
  load.messages_rejected = int64_t(socket_->rejected());
  load.prefix_cache_queries = stats.prefix_query_tokens;
  load.prefix_cache_hits = stats.prefix_hit_tokens;
  load.prefix_cache_ssd_hits = stats.prefix_ssd_hit_tokens;
  load.workspace_bytes = int64_t(engine_->model().backend().workspace_bytes());
  if (const int32_t slots = transfer_->staging_slots(); slots > 0) {
    load.staging_slots = slots;
    load.staging_slots_free = transfer_->staging_slots_free();
    load.staging_waits = int64_t(transfers.sends_waited_for_slots);
  }
  if (const engine::SsdKvStore* ssd = engine_->scheduler().ssd_store()) {
    const engine::SsdKvStoreStats tier = ssd->stats();
    load.ssd_cache_blocks = tier.stored_blocks;
    load.ssd_cache_capacity = tier.capacity_blocks;
    load.ssd_restoring = stats.restoring;
  }
  return load;
}

kv_transfer::TransferCallback NodeRuntime::completion_sink() {
  return [this](const kv_transfer::TransferResult& result) {
    {
      std::lock_guard lock(completions_mutex_);
      completions_.push_back(result);
    }
    wake_.signal();
  };
}

std::vector<kv_transfer::TransferResult> NodeRuntime::take_completions() {
  std::lock_guard lock(completions_mutex_);
  return std::exchange(completions_, {});
}

}  // namespace baton::node
