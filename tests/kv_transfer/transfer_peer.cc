// tests/kv_transfer/transfer_peer.cc — the other process of the two-process
// transfer tests. It owns a KV pool and a TransferEngine and obeys line
// commands on stdin, answering on stdout:
//   start: transfer_peer <tls> <mode> <num_layers> <num_blocks> <block_size> <kv_heads>
//                        <head_dim> <dtype> <seed> <peer_seed> <peer_num_blocks>
//                        <peer_error_handling 0|1> <shared_pool 0|1> <staged 0|1>
//                        [staging_blocks]
//          staged: the pool is memory UCX never sees, moved through
//          staging_blocks host slots (0, the default: as many as the pool
//          has blocks; tests/kv_transfer/kv_test_util.h HostPoolCopier)
//          A pool seeded with `seed` (0: poisoned, a receiver) -> "DESC <hex>"
//   PEER <hex>                                  -> "PEER_OK <id>" | "ERR ..."
//   EXPECT req tid lb le deadline_ms n src... dst... -> "EXPECT_OK tid wire..." (the blocks
//                                                  the sender is to write, paired with dst),
//                                                  later "RECV tid code ops bytes verified"
//   SEND req tid peer lb le deadline_ms layer_delay_ms n src... dst...
//                                               -> "SEND_OK tid", "POSTED tid layer" per layer
//                                                  (if delayed), later "SENT tid code ops bytes
//                                                  mode"
//   POISON_CHECK                                -> "POISON ok|bad"
//   STATS                                       -> "STATS notices_rejected data_rejected"
//   QUIT
#include <sys/mman.h>

#include <cstdio>
#include <iostream>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/logging.h"
#include "kv_transfer/transfer_engine.h"
#include "tests/kv_transfer/kv_test_util.h"

using namespace baton;
using namespace baton::kv_transfer;
using namespace baton::kv_transfer::testing;

namespace {

std::mutex out_mutex;
void say(const std::string& line) {
  std::lock_guard lock(out_mutex);
  std::cout << line << std::endl;
}

std::vector<int32_t> read_ints(const std::vector<std::string>& w, size_t at, size_t n) {
  std::vector<int32_t> v;
  for (size_t i = 0; i < n; ++i) v.push_back(std::stoi(w.at(at + i)));
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 15 && argc != 16) {
    std::fprintf(stderr, "usage: see tests/kv_transfer/transfer_peer.cc\n");
    return 2;
  }
  init_logging("transfer_peer");
  KvLayout layout;
  layout.num_layers = std::stoi(argv[3]);
  layout.num_blocks = std::stoi(argv[4]);
  layout.block_size = std::stoi(argv[5]);
  layout.num_kv_heads = std::stoi(argv[6]);
  layout.head_dim = std::stoi(argv[7]);
  layout.dtype = *parse_kv_dtype(argv[8]);
  uint64_t seed = std::stoull(argv[9]);
  uint64_t peer_seed = std::stoull(argv[10]);
  KvLayout peer_layout = layout;
  peer_layout.num_blocks = std::stoi(argv[11]);

  size_t bytes = layout.total_bytes();
  // Shared: UCX allocates the pool (TransferEngine::create without one).
  const bool shared_pool = std::string(argv[13]) == "1";
  const bool staged = std::string(argv[14]) == "1";
  uint8_t* pool = nullptr;
  if (!shared_pool || staged) {
    pool = static_cast<uint8_t*>(
        mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  }
  // (layer, block) regions a successful transfer wrote.
  std::vector<bool> written(size_t(layout.num_layers) * layout.num_blocks, false);
  std::mutex written_mutex;

  TransferConfig config;
  config.ucx_env["UCX_TLS"] = argv[1];
  config.ucx_env["UCX_NET_DEVICES"] = "lo";
  config.mode = *parse_transfer_mode(argv[2]);
  config.peer_error_handling = std::string(argv[12]) == "1";
  config.node_name = seed != 0 ? "child-sender" : "child-receiver";
  if (argc == 16) config.staging_blocks = std::stoi(argv[15]);
  std::unique_ptr<PoolCopier> copier;
  if (staged) copier = std::make_unique<HostPoolCopier>(pool, bytes);
  auto engine = TransferEngine::create(config, layout, pool, bytes, std::move(copier));
  if (!engine.is_ok()) {
    say("ERR " + engine.status().to_string());
    return 1;
  }
  pool = static_cast<uint8_t*>((*engine)->pool());
  if (seed != 0) {
    fill_pattern(pool, bytes, seed);
  } else {
    std::memset(pool, kPoison, bytes);
  }
  say("DESC " + to_hex((*engine)->descriptor()));

  std::vector<std::thread> posters;
  std::string line;
  while (std::getline(std::cin, line)) {
    auto w = split(line);
    if (w.empty()) continue;
    if (w[0] == "QUIT") break;
    if (w[0] == "PEER") {
      auto id = (*engine)->add_peer(from_hex(w[1]));
      say(id.is_ok() ? "PEER_OK " + std::to_string(*id) : "ERR " + id.status().to_string());
    } else if (w[0] == "EXPECT") {
      RecvSpec spec;
      spec.request_id = std::stoull(w[1]);
      spec.transfer_id = std::stoull(w[2]);
      spec.layer_begin = std::stoi(w[3]);
      spec.layer_end = std::stoi(w[4]);
      spec.deadline = std::chrono::milliseconds(std::stoi(w[5]));
      size_t n = std::stoul(w[6]);
      auto src = read_ints(w, 7, n);
      spec.dst_blocks = read_ints(w, 7 + n, n);
      auto dst = spec.dst_blocks;
      int32_t lb = spec.layer_begin, le = spec.layer_end;
      std::vector<int32_t> wire;
      Status s = (*engine)->expect(
          std::move(spec),
          [&, src, dst, lb, le](const TransferResult& r) {
            bool verified = false;
            if (r.status.is_ok()) {
              verified = true;
              for (int32_t l = lb; l < le; ++l) {
                for (size_t i = 0; i < src.size(); ++i) {
                  verified &= matches_pattern(pool + layout.block_byte_offset(l, dst[i]),
                                              peer_layout.block_byte_offset(l, src[i]),
                                              layout.block_bytes(), peer_seed);
                  std::lock_guard lock(written_mutex);
                  written[size_t(l) * layout.num_blocks + dst[i]] = true;
                }
              }
            }
            say("RECV " + std::to_string(r.transfer_id) + " " +
                std::to_string(int(r.status.code())) + " " + std::to_string(r.ops) + " " +
                std::to_string(r.bytes) + " " + (verified ? "1" : "0"));
          },
          &wire);
      if (!s.is_ok()) {
        say("ERR " + s.to_string());
      } else {
        std::string ok = "EXPECT_OK " + w[2];
        for (int32_t b : wire) ok += " " + std::to_string(b);
        say(ok);
      }
    } else if (w[0] == "SEND") {
      SendSpec spec;
      spec.request_id = std::stoull(w[1]);
      spec.transfer_id = std::stoull(w[2]);
      PeerId peer = PeerId(std::stoul(w[3]));
      spec.layer_begin = std::stoi(w[4]);
      spec.layer_end = std::stoi(w[5]);
      spec.deadline = std::chrono::milliseconds(std::stoi(w[6]));
      int delay_ms = std::stoi(w[7]);
      size_t n = std::stoul(w[8]);
      spec.src_blocks = read_ints(w, 9, n);
      spec.dst_blocks = read_ints(w, 9 + n, n);
      uint64_t tid = spec.transfer_id;
      int32_t lb = spec.layer_begin, le = spec.layer_end;
      Status s = (*engine)->begin_send(peer, std::move(spec), [](const TransferResult& r) {
        say("SENT " + std::to_string(r.transfer_id) + " " + std::to_string(int(r.status.code())) +
            " " + std::to_string(r.ops) + " " + std::to_string(r.bytes) + " " +
            std::string(transfer_mode_name(r.mode)));
      });
      if (!s.is_ok()) {
        say("ERR " + s.to_string());
        continue;
      }
      say("SEND_OK " + w[2]);
      // Layers "computed" one by one, like a prefill.
      posters.emplace_back([&engine, tid, lb, le, delay_ms] {
        for (int32_t l = lb + 1; l <= le; ++l) {
          if (delay_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
          if (!(*engine)->post_layers(tid, l).is_ok()) return;
          if (delay_ms > 0) say("POSTED " + std::to_string(tid) + " " + std::to_string(l));
        }
      });
    } else if (w[0] == "POISON_CHECK") {
      bool ok = true;
      std::lock_guard lock(written_mutex);
      for (int32_t l = 0; l < layout.num_layers; ++l) {
        for (int32_t b = 0; b < layout.num_blocks; ++b) {
          if (written[size_t(l) * layout.num_blocks + b]) continue;
          const uint8_t* p = pool + layout.block_byte_offset(l, b);
          for (size_t i = 0; i < layout.block_bytes(); ++i) ok &= p[i] == kPoison;
        }
      }
      say(std::string("POISON ") + (ok ? "ok" : "bad"));
    } else if (w[0] == "STATS") {
      auto st = (*engine)->stats();
      say("STATS " + std::to_string(st.notices_rejected) + " " + std::to_string(st.data_rejected));
    }
  }
  for (auto& t : posters) t.join();
  engine->reset();
  if (!shared_pool || staged) munmap(pool, bytes);
  return 0;
}
