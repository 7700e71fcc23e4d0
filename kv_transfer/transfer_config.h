// kv_transfer/transfer_config.h — every setting of the transfer engine, declared once.
//
// The node's YAML loader fills a TransferConfig; the engine takes it by value
// and never reads the environment itself. UCX variables (UCX_TLS,
// UCX_NET_DEVICES, keepalive and TCP timeouts...) pass through `ucx_env`, applied
// to the UCP configuration with ucp_config_modify before the context is built.
#pragma once

#include <chrono>
#include <map>
#include <optional>
#include <string>
#include <string_view>

#include "common/status.h"

namespace baton::kv_transfer {

// How KV bytes cross the wire.
//  kAuto: RMA when UCX reports a native RMA lane to the peer, tagged
//         rendezvous into the registered destination otherwise.
//  kRma:  one-sided puts (ucp_put_nbx), even where UCX only emulates them.
//  kTag:  tagged sends; the receiver probes each message's tag (transfer,
//         layer, block), checks it against its expectations and receives it
//         straight into the reserved blocks (rendezvous: zero-copy).
//  kAm:   the same with active messages (UCX 1.13's AM rendezvous is slower).
// kAm, and kRma where UCX only emulates puts, are for measurements: with UCX
// 1.13 a peer that dies mid-transfer can abort this process in them (an
// assertion, `ucs_fatal`), which a warning says when such a peer connects.
enum class TransferMode { kAuto, kRma, kTag, kAm };

std::string_view transfer_mode_name(TransferMode mode);
std::optional<TransferMode> parse_transfer_mode(std::string_view name);

// Where the node's KV pool lives. A pool in CUDA memory is staged through
// registered host slots (TransferEngine::create's PoolCopier): Debian's UCX
// has no CUDA support, and the checksum is hashed on the host.
enum class PoolMemory { kHost, kCuda };

inline constexpr std::chrono::milliseconds kMinCloseTimeout{100};

struct TransferConfig {
  // A transfer (sender) or expectation (receiver) without an explicit deadline
  // fails with kDeadlineExceeded after this long. Unit: milliseconds.
  std::chrono::milliseconds default_deadline{3000};
  // Bound on tearing an endpoint down (nonblocking close + progress). Also
  // how long a failed receiver waits for a granted sender's puts before it
  // frees their blocks, and so a sender refuses a grant whose ask is older
  // than 3/4 of it: at least kMinCloseTimeout.
  std::chrono::milliseconds close_timeout{1000};
  // Longest the progress thread sleeps in epoll when nothing is in flight;
  // deadlines are checked at least this often.
  std::chrono::milliseconds idle_wait{20};
  TransferMode mode = TransferMode::kAuto;
  // The sender hashes what it sends (xxhash, overlapped with the transfer) and
  // the receiver recomputes it over the written blocks. Off only in benchmarks
  // that measure the wire alone; a verifying receiver rejects an unhashed transfer.
  bool verify_checksum = true;
  PoolMemory pool_memory = PoolMemory::kHost;
  // A staged pool's transfers move through this many registered host slots
  // of one block (every layer) each, pinned where the copier can: a
  // transfer holds one per block from expect(), or from when its send is
  // given them (at once, or after waiting), until its callback. 0: as many
  // as the pool has blocks.
  int32_t staging_blocks = 0;
  // A node lets UCX allocate its KV pool (TransferEngine::create without a
  // pool), from shared memory where it can, so a peer on the same host maps
  // the pool and writes blocks with plain stores (auto then picks puts): one
  // copy, no kernel, no rendezvous. Across hosts it changes nothing. Off: the
  // engine maps a private pool (transfers on one host then take CMA).
  bool share_pool = true;
  // Ask UCX for peer error handling (UCP_ERR_HANDLING_MODE_PEER) so a dead
  // peer surfaces at once, not at the deadline. UCX 1.13 then avoids some
  // zero-copy protocols (no CMA rendezvous, for one), so throughput-bound
  // deployments may turn it off and rely on deadlines and acks alone.
  bool peer_error_handling = true;
  // "UCX_TLS" -> "tcp", "UCX_KEEPALIVE_INTERVAL" -> "1s", ... Keys must start with "UCX_".
  std::map<std::string, std::string> ucx_env;
  // Name for logs ("prefill-0").
  std::string node_name = "node";
  // Fault injection, for fault tests only: the first this many completion
  // notices this engine would send are dropped instead (each logged), as if
  // lost on the way; both sides of such a transfer then fail at their
  // deadlines or cancels. Nodes take it from BATON_FAULT_DROP_NOTICES.
  uint32_t drop_notices = 0;
  // Fault injection, for fault tests only: as this receiver hashes the
  // blocks of this layer of a transfer (-1: none), it first flips a bit of
  // the first one (of a row's scale in the 8-bit formats), as if the wire
  // had corrupted it.
  int32_t corrupt_landed_layer = -1;
};

// Checks ranges; a bad value is an error naming the field.
Status validate(const TransferConfig& config);

// A staged pool needs a slot per block of the longest prompt's transfer:
// an error naming `key` (where staging_blocks was set) when
// `staging_blocks` (> 0) are fewer than `longest_tokens` (max_model_len, or
// what sliding windows let a transfer carry: engine::tokens_sent_at_most)
// in `block_size`-token blocks need.
Status check_staging_blocks(int32_t staging_blocks, int64_t longest_tokens, int32_t block_size,
                            const std::string& key);

// The longest deadline or timeout accepted. Far longer than any transfer of
// one request may take, and far enough from the clock's range that adding it
// to now cannot overflow.
inline constexpr std::chrono::milliseconds kMaxDeadline = std::chrono::hours(24);

// ok if 0 < d <= kMaxDeadline; otherwise an error that names `what`.
Status check_duration(std::chrono::milliseconds d, const std::string& what);

}  // namespace baton::kv_transfer
