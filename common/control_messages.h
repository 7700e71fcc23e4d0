// common/control_messages.h — the control plane's messages between the router
// and the prefill and decode nodes, and their codec.
//
// Every message is one ZeroMQ frame holding a MessagePack map with a protocol
// version `v`, a type `t` and typed fields (the self-describing binary shape
// vLLM's engine-core protocol also uses). Decoding never trusts the sender:
// the frame size, every field's presence, type and range, and every list's
// length are checked against the bounds below; a malformed, truncated,
// oversized or unknown message is a kDataLoss Status naming the message and
// the field, never an exception or a crash. KV bytes never travel here: only
// ids, block lists, UCX pool descriptors and tokens do.
//
// The request flow these messages carry (docs/ARCHITECTURE.md has the picture):
//   router -> decode   Generate      (prefill_node empty: prefill on the decode node)
//   decode -> router   PrefillReady  (blocks reserved, expectation live)
//   router -> prefill  Prefill       (where to write the KV)
//   prefill -> router  PrefillDone   (KV landed and acknowledged; first token)
//   router -> decode   PrefillDone   (forwarded)
//   decode -> router   Events        (tokens and finishes of one step)
//   router -> any      Abort         (client gone, timeout, peer down)
//   any -> sender      Rejected      (a frame that did not decode, and why)
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "common/finish_reason.h"
#include "common/role.h"
#include "common/status.h"

namespace baton::control {

// 2: PrefillReady and Prefill carry skipped_blocks (sliding windows);
// PrefillDone and TokenEvent the queue and prefill seconds; Generate and
// Prefill the client's request id.
inline constexpr int32_t kProtocolVersion = 3;
// Bounds that keep a hostile frame from becoming a huge allocation.
inline constexpr size_t kMaxMessageBytes = 16u << 20;
inline constexpr size_t kMaxPromptTokens = 1u << 20;
inline constexpr size_t kMaxBlocksPerRequest = 1u << 20;
inline constexpr size_t kMaxEventsPerMessage = 1u << 16;
inline constexpr size_t kMaxStringBytes = 4096;
inline constexpr size_t kMaxKvPaths = 1024;
// The prompt log-probabilities one frame may carry: tokens (a map each) and
// values (2 a token, 2 an alternative), about half of the maps and values
// its decoder takes, leaving the rest of the frame room. The router refuses
// requests that would need more.
inline constexpr size_t kMaxPromptLogprobValues = size_t(1) << 20;
inline constexpr size_t kMaxPromptLogprobTokens = size_t(1) << 17;
// The prompt tokens a frame can score with `alternatives` each.
constexpr size_t max_prompt_logprob_tokens(size_t alternatives) {
  const size_t by_values = kMaxPromptLogprobValues / (2 + 2 * alternatives);
  return by_values < kMaxPromptLogprobTokens ? by_values : kMaxPromptLogprobTokens;
}
inline constexpr int64_t kMaxLoadValue = int64_t(1) << 50;  // any NodeLoad field
// A request's id as its client gave it (X-Request-Id), in nodes' logs.
inline constexpr size_t kMaxClientIdBytes = 128;
inline constexpr size_t kMaxDescriptorBytes = 256u << 10;
inline constexpr size_t kMaxStopTokenIds = 1024;
inline constexpr int32_t kMaxTopLogprobs = 1024;
inline constexpr size_t kMaxLogitBias = 300;  // entries, as OpenAI allows
// Real numbers (temperature, top_p, log-probabilities) must stay within this
// magnitude, so they are finite as floats too. The router's request
// validation applies the same bounds, so a request it admits always encodes.
inline constexpr double kMaxRealMagnitude = 1e30;

// How a request samples; mirrors engine::GenerationOptions without depending on it.
struct SamplingSpec {
  float temperature = 1.0f;
  float top_p = 1.0f;
  int32_t top_k = 0;
  uint64_t seed = 0;
  int32_t max_tokens = 16;
  std::vector<int32_t> stop_token_ids;
  bool ignore_eos = false;
  int32_t logprobs = 0;  // top-N log-probabilities per output token; 0 = none
  // Top-N log-probabilities of each prompt token after the first (0: its
  // own only); -1: none. Whoever computes the prompt reports them.
  int32_t prompt_logprobs = -1;
  // vLLM's sampling extras (kernels/cpu/sampling.h); defaults ask for nothing
  // and are left out of the frame.
  float min_p = 0.0f;
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  float repetition_penalty = 1.0f;
  int32_t min_tokens = 0;
  std::vector<int32_t> logit_bias_ids;  // paired with logit_bias_values
  std::vector<float> logit_bias_values;
};

// One output token's log-probability and the top-N alternatives.
struct TokenLogprobs {
  float logprob = 0;
  std::vector<int32_t> top_ids;
  std::vector<float> top_logprobs;  // paired with top_ids
};

// A node's load, as heartbeats report it.
struct NodeLoad {
  int64_t running = 0;         // sequences in the running batch
  int64_t waiting = 0;         // queued, not yet admitted
  int64_t awaiting_kv = 0;     // decode: blocks reserved, KV still in flight
  int64_t waiting_tokens = 0;  // prompt tokens queued and not yet computed
  int64_t free_blocks = 0;
  int64_t total_blocks = 0;
  int64_t prompt_tokens = 0;      // counters since start
  int64_t generation_tokens = 0;  // counters since start
  int64_t preemptions = 0;
  int64_t transfers_ok = 0;
  int64_t transfers_failed = 0;
  int64_t messages_rejected = 0;      // malformed control frames dropped
  int64_t prefix_cache_queries = 0;   // prompt tokens looked up in the prefix cache, since start
  int64_t prefix_cache_hits = 0;      // of those, found there (not computed)
  int64_t prefix_cache_ssd_hits = 0;  // of those, read back from the SSD tier
  int64_t ssd_cache_blocks = 0;       // blocks the SSD tier holds now
  int64_t ssd_cache_capacity = 0;     // blocks it can hold (0: no SSD tier)
  int64_t ssd_restoring = 0;          // requests whose blocks the SSD tier is reading now
  int64_t workspace_bytes = 0;        // the forward pass's scratch, where it computes
  // A staged pool's host slots (transfer.staging_blocks; 0: the pool is
  // registered in place), and those no transfer holds now.
  int64_t staging_slots = 0;
  int64_t staging_slots_free = 0;
  int64_t staging_waits = 0;  // staged sends that queued for slots, since start
  // Requests the node keeps any state for (a decode node's in every state,
  // a prefill node's jobs and held prompts): 0 once it is idle.
  int64_t requests = 0;
};

// NodeLoad's fields by name, in one place for the codec and for reports. A
// heartbeat that lacks one (a node of an older build) reports it as 0, so a
// router can be upgraded ahead of its nodes.
struct NodeLoadField {
  const char* name;
  int64_t NodeLoad::*member;
};
inline constexpr NodeLoadField kNodeLoadFields[] = {
    {"running", &NodeLoad::running},
    {"waiting", &NodeLoad::waiting},
    {"awaiting_kv", &NodeLoad::awaiting_kv},
    {"waiting_tokens", &NodeLoad::waiting_tokens},
    {"free_blocks", &NodeLoad::free_blocks},
    {"total_blocks", &NodeLoad::total_blocks},
    {"prompt_tokens", &NodeLoad::prompt_tokens},
    {"generation_tokens", &NodeLoad::generation_tokens},
    {"preemptions", &NodeLoad::preemptions},
    {"transfers_ok", &NodeLoad::transfers_ok},
    {"transfers_failed", &NodeLoad::transfers_failed},
    {"messages_rejected", &NodeLoad::messages_rejected},
    {"prefix_cache_queries", &NodeLoad::prefix_cache_queries},
    {"prefix_cache_hits", &NodeLoad::prefix_cache_hits},
    {"prefix_cache_ssd_hits", &NodeLoad::prefix_cache_ssd_hits},
    {"ssd_cache_blocks", &NodeLoad::ssd_cache_blocks},
    {"ssd_cache_capacity", &NodeLoad::ssd_cache_capacity},
    {"ssd_restoring", &NodeLoad::ssd_restoring},
    {"workspace_bytes", &NodeLoad::workspace_bytes},
    {"staging_slots", &NodeLoad::staging_slots},
    {"staging_slots_free", &NodeLoad::staging_slots_free},
    {"staging_waits", &NodeLoad::staging_waits},
    {"requests", &NodeLoad::requests},
};

struct Register {  // node -> router, first message and after a reconnect
  std::string node;
  Role role = Role::kPrefill;       // kPrefill or kDecode
  std::vector<uint8_t> descriptor;  // kv_transfer PoolDescriptor, encoded
  int32_t block_size = 0;
  int32_t max_model_len = 0;
  int64_t pid = 0;
  // The KV format (dtype_name: "bf16", "int8", ...) and what a token of it
  // occupies across all layers, scales included. Every node of a cluster
  // keeps one format: blocks move between them as bytes.
  std::string kv_dtype;
  int64_t kv_bytes_per_token = 0;
  // Where the node computes and keeps its pool (engine/device.h: "cpu",
  // "cuda:0"), and how that pool meets the wire (TransferEngine::staging():
  // "" when registered in place).
  std::string device;
  std::string kv_staging;
  // Memory the node holds where it computes: its weights (as its backend
  // keeps them) and its KV pool.
  int64_t weights_bytes = 0;
  int64_t kv_pool_bytes = 0;
  // Whether its prefix cache shares computed blocks (engine.enable_prefix_caching).
  // Optional on the wire (absent: true).
  bool prefix_caching = true;
};
struct RegisterAck {  // router -> node
  bool accepted = false;
  std::string message;
  // A welcome's number for this registration; in a refused heartbeat's
  // answer, the number the heartbeat carried. 0: none (a Register refused,
  // or a router that numbers none). Optional on the wire.
  uint64_t registration = 0;
};
struct Heartbeat {  // node -> router, every heartbeat interval
  std::string node;
  NodeLoad load;
  // A prefill node's path to each decode node it has sent KV to while that
  // endpoint is up (TransferEngine::peer_path): decode node -> path.
  // Optional on the wire (absent: none), at most kMaxKvPaths entries.
  std::map<std::string, std::string> kv_paths{};
  // The registration it is sent under (RegisterAck::registration); 0: none.
  // Optional on the wire.
  uint64_t registration = 0;
};
struct PeerInfo {  // router -> prefill: a decode node's pool descriptor
  std::string node;
  std::vector<uint8_t> descriptor;
};
struct Generate {  // router -> decode
  uint64_t request_id = 0;
  std::vector<int32_t> prompt;
  SamplingSpec sampling;
  std::string prefill_node;  // empty: prefill on the decode node itself
  // The client's id of the request (X-Request-Id, or the router's own), for
  // logs: one request can be followed across processes with grep.
  std::string client_id;
};
struct PrefillReady {  // decode -> router
  uint64_t request_id = 0;
  uint64_t transfer_id = 0;
  // Where the prompt's blocks after the first `cached_blocks` and
  // `skipped_blocks` more are to be written, in prompt order: the decode
  // node's reserved blocks, or the host slots standing for them where its
  // pool is staged (kv_transfer's expect()). The first it holds already
  // (its prefix cache); the next no query of its sliding windows will read.
  // The prefill node neither sends nor writes either.
  std::vector<int32_t> dst_blocks;
  int32_t cached_blocks = 0;
  int32_t skipped_blocks = 0;
};
struct Prefill {  // router -> prefill
  uint64_t request_id = 0;
  std::vector<int32_t> prompt;
  SamplingSpec sampling;
  std::string decode_node;
  uint64_t transfer_id = 0;
  std::vector<int32_t> dst_blocks;  // as PrefillReady has them
  int32_t cached_blocks = 0;
  int32_t skipped_blocks = 0;
  std::string client_id;  // as Generate has it
};
struct PrefillDone {  // prefill -> router, forwarded to decode
  uint64_t request_id = 0;
  int32_t first_token = -1;
  uint64_t rng_draws = 0;  // draws of the request's generator the first token took
  std::string error;       // empty: the KV is in the decode node's blocks
  std::vector<TokenLogprobs> first_logprobs;  // one entry when the request asked for logprobs
  // With sampling.prompt_logprobs: one per prompt token after the first.
  std::vector<TokenLogprobs> prompt_logprobs;
  // The prefill node's queue and prefill seconds (engine::Sequence); -1: none.
  float queue_seconds = -1;
  float prefill_seconds = -1;
  // Prompt tokens the prefill node's prefix cache held
  // (engine::Sequence::cached_prompt_tokens); -1: not told (an older node).
  int32_t cached_tokens = -1;
};
struct Abort {  // router -> node
  uint64_t request_id = 0;
  std::string reason;
};
// The answer to a frame that did not decode, so its sender learns at once
// why instead of waiting out a timeout. `type` and `request_id` are what
// could be read of the refused frame (empty and 0 when nothing could).
struct Rejected {
  std::string type;
  uint64_t request_id = 0;
  std::string reason;
};
struct TokenEvent {
  uint64_t request_id = 0;
  std::vector<int32_t> tokens;                       // new tokens, in order
  FinishReason finish_reason = FinishReason::kNone;  // kNone: more to come
  std::string error;                                 // with "error" and "abort": why
  std::vector<TokenLogprobs> logprobs;  // one per token when the request asked for them
  // With the first token, where this node computed the prompt and the
  // request asked for them: one per prompt token after the first.
  std::vector<TokenLogprobs> prompt_logprobs;
  // With the first token, where this node computed the prompt: its queue
  // and prefill seconds (engine::Sequence); -1 otherwise.
  float queue_seconds = -1;
  float prefill_seconds = -1;
  // With the first token, where this node computed the prompt: the prompt
  // tokens its prefix cache held; -1 otherwise.
  int32_t cached_tokens = -1;
};
struct Events {  // decode -> router, once per step that produced something
  std::vector<TokenEvent> events;
};

using Message = std::variant<Register, RegisterAck, Heartbeat, PeerInfo, Generate, PrefillReady,
                             Prefill, PrefillDone, Abort, Events, Rejected>;

// The message's wire type name ("generate", "prefill_done", ...).
std::string_view message_type(const Message& message);

std::vector<uint8_t> encode(const Message& message);

// kDataLoss naming the type and field when anything is off.
Result<Message> decode(std::span<const uint8_t> frame);
// What can be read of a frame `decode` refused (its type and request id, when
// its envelope is intact), with the refusal as the reason.
Rejected rejection_of(std::span<const uint8_t> frame, const Status& refusal);

// The decoder's bounds on one frame besides kMaxMessageBytes: its maps, and
// its values (every scalar, list and map).
inline constexpr size_t kMaxFrameMaps = 4 * kMaxEventsPerMessage;
inline constexpr size_t kMaxFrameValues = kMaxPromptTokens + kMaxBlocksPerRequest + (64u << 10);

// A step's events as frames that each stay within three quarters of those
// bounds (an estimate of the encoded bytes, maps and values), in order:
// several requests' first tokens with their prompt log-probabilities may
// outgrow one frame, which the router would refuse whole. An event that
// alone passes them goes alone (the router bounds a request's prompt
// log-probabilities so that one event still decodes).
std::vector<Events> split_events(std::vector<TokenEvent> events);

}  // namespace baton::control
