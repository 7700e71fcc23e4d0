// bench/transfer/transfer_bench.cc — one request's KV from a prefill pool to a
// decode pool, two processes on this machine, over the UCX transport given.
//
// For each (model, block size, prompt length) it reports the bytes, the
// operations per transfer after merging, the achieved rate (first byte posted
// -> receiver notified) in the same MB/s (2^20 bytes/s) ucx_perftest prints,
// and the time from the last layer posted to "decode node may start" (the
// receiver's completion callback). The ceiling beside it is ucx_perftest's, run
// by run_transfer_bench.sh at the same message size.
//
// --pool says where both pools live: `host` (UCX reads and writes them in
// place), `staged` (host memory moved through the engine's host slots by
// memcpy: the path of a device pool, with the device's copies replaced) or
// `cuda` (device memory, staged through pinned slots; builds with the CUDA
// backend only). Staged rows also print the copier's own rate over the
// whole pool, out and in: a staged transfer overlaps its copies with the
// wire, so the slowest of the three bounds it.
//
//   transfer_bench --tls tcp --mode auto [--verify 1] [--iters 5] [--streamed 0]
//                  [--models smollm2-135m,llama3-8b] [--tokens 512,2048,8192,16384]
//                  [--block-sizes 16,64] [--fragmented 0] [--peer-errors 1]
//                  [--layer-gap-us 0] [--net-devices lo] [--pool host]
//                  [--staging-blocks 0]
// The process re-executes itself with --receiver for the decode side.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/logging.h"
#include "common/pool_copier.h"
#include "kv_transfer/transfer_engine.h"
#ifdef BATON_BENCH_CUDA
#include "kernels/cuda/device.h"
#include "kernels/cuda/pool_copier.h"
#endif

extern char** environ;

using namespace baton;
using namespace baton::kv_transfer;
using namespace std::chrono_literals;

namespace {

struct Model {
  const char* name;
  int32_t layers, kv_heads, head_dim;
};
// KV geometry of the real models (bf16 KV).
const Model kModels[] = {{"smollm2-135m", 30, 3, 64}, {"llama3-8b", 32, 8, 128}};

std::map<std::string, std::string> parse_args(int argc, char** argv) {
  std::map<std::string, std::string> a = {{"tls", "tcp"},
                                          {"mode", "auto"},
                                          {"verify", "1"},
                                          {"iters", "5"},
                                          {"streamed", "0"},
                                          {"models", "smollm2-135m,llama3-8b"},
                                          {"tokens", "512,2048,8192,16384"},
                                          {"block-sizes", "16,64"},
                                          {"fragmented", "0"},
                                          {"layer-gap-us", "0"},
                                          {"receiver", "0"},
                                          {"model", ""},
                                          {"block-size", "16"},
                                          {"num-blocks", "0"},
                                          {"peer-errors", "1"},
                                          {"ucx-pool", "0"},
                                          {"pool", "host"},
                                          {"staging-blocks", "0"},
                                          {"net-devices", "lo"}};
  for (int i = 1; i + 1 < argc; i += 2) a[std::string(argv[i]).substr(2)] = argv[i + 1];
  return a;
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::stringstream in(s);
  std::string w;
  while (std::getline(in, w, sep)) {
    if (!w.empty()) out.push_back(w);
  }
  return out;
}

std::string hex(const std::vector<uint8_t>& b) {
  std::string s;
  char buf[3];
  for (uint8_t x : b) {
    std::snprintf(buf, sizeof buf, "%02x", x);
    s += buf;
  }
  return s;
}

std::vector<uint8_t> unhex(const std::string& s) {
  std::vector<uint8_t> b;
  for (size_t i = 0; i + 1 < s.size(); i += 2)
    b.push_back(uint8_t(std::stoi(s.substr(i, 2), nullptr, 16)));
  return b;
}

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
      .count();
}

KvLayout layout_for(const Model& m, int32_t block_size, int32_t num_blocks) {
  KvLayout l;
  l.num_layers = m.layers;
  l.num_blocks = num_blocks;
  l.block_size = block_size;
  l.num_kv_heads = m.kv_heads;
  l.head_dim = m.head_dim;
  l.dtype = DType::kBF16;
  return l;
}

TransferConfig config_from(const std::map<std::string, std::string>& a, const char* name) {
  TransferConfig c;
  c.ucx_env["UCX_TLS"] = a.at("tls");
  c.ucx_env["UCX_NET_DEVICES"] = a.at("net-devices");
  c.mode = parse_transfer_mode(a.at("mode")).value_or(TransferMode::kAuto);
  c.verify_checksum = a.at("verify") == "1";
  c.peer_error_handling = a.at("peer-errors") == "1";
  c.default_deadline = 60s;
  c.node_name = name;
  if (a.at("pool") != "host") {
    c.pool_memory = PoolMemory::kCuda;  // staged, whatever holds the pool
    c.staging_blocks = std::stoi(a.at("staging-blocks"));
  }
  return c;
}

struct Pool {
  explicit Pool(size_t n) : bytes(n) {
    data = static_cast<uint8_t*>(
        mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
    std::memset(data, 0x5a, n);  // touch every page before timing
  }
  ~Pool() { munmap(data, bytes); }
  Pool(const Pool&) = delete;
  Pool& operator=(const Pool&) = delete;
  uint8_t* data;
  size_t bytes;
};

// One side's pool as --pool asks, and the copier that stages it (none for
// `host`, or where UCX allocates the pool: --ucx-pool 1).
struct BenchPool {
  std::unique_ptr<Pool> host;
#ifdef BATON_BENCH_CUDA
  kernels::cuda::DeviceBuffer device;
#endif
  void* data = nullptr;
  std::unique_ptr<PoolCopier> copier;
};

// A copier for the pool at `data` as --pool asks (none for `host`).
Result<std::unique_ptr<PoolCopier>> make_copier(const std::string& kind, void* data, size_t bytes) {
  if (kind == "staged") return make_host_pool_copier(data, bytes);
#ifdef BATON_BENCH_CUDA
  if (kind == "cuda") return kernels::cuda::make_pool_copier(data, bytes);
#endif
  return std::unique_ptr<PoolCopier>();
}

Result<BenchPool> make_pool(const std::map<std::string, std::string>& a, size_t bytes) {
  BenchPool p;
  const std::string& kind = a.at("pool");
  if (kind != "host" && kind != "staged" && kind != "cuda")
    return invalid_argument("--pool " + kind + ": host, staged or cuda");
  if (kind == "cuda") {
#ifdef BATON_BENCH_CUDA
    BATON_ASSIGN_OR_RETURN(p.device, kernels::cuda::DeviceBuffer::allocate(bytes));
    std::vector<uint8_t> fill(std::min<size_t>(bytes, 64 << 20), 0x5a);
    for (size_t at = 0; at < bytes; at += fill.size())
      BATON_RETURN_IF_ERROR(
          p.device.copy_from_host(fill.data(), std::min(fill.size(), bytes - at), at));
    p.data = p.device.data();
#else
    return unimplemented("--pool cuda: this build has no CUDA backend");
#endif
  } else if (a.at("ucx-pool") == "1") {
    if (kind != "host") return invalid_argument("--ucx-pool 1 needs --pool host");
    return p;  // UCX allocates it
  } else {
    p.host = std::make_unique<Pool>(bytes);
    p.data = p.host->data;
  }
  BATON_ASSIGN_OR_RETURN(p.copier, make_copier(kind, p.data, bytes));
  return p;
}

// MB/s of the copier moving the whole pool out to pinned host memory, then
// back (best of three each): the staging's own ceiling.
struct CopierRate {
  double out = 0, in = 0;
};
CopierRate copier_rate(const std::string& kind, void* pool, size_t bytes) {
  Pool host(bytes);
  // Declared after the memory it pins: destroyed (unpinning it) first.
  auto made = make_copier(kind, pool, bytes);
  if (!made.is_ok() || *made == nullptr) return {};
  PoolCopier& copier = **made;
  (void)copier.pin(host.data, bytes);  // a device copier pins; the host one refuses
  const PoolCopier::Range whole{.offset = 0, .bytes = bytes, .host_offset = 0};
  CopierRate best;
  for (int round = 0; round < 3; ++round) {
    int64_t t0 = now_ns();
    if (!copier.to_host(host.data, {&whole, 1}).is_ok()) return {};
    int64_t t1 = now_ns();
    if (!copier.to_device(host.data, {&whole, 1}).is_ok()) return {};
    int64_t t2 = now_ns();
    best.out = std::max(best.out, double(bytes) / (double(t1 - t0) * 1e-9) / (1 << 20));
    best.in = std::max(best.in, double(bytes) / (double(t2 - t1) * 1e-9) / (1 << 20));
  }
  return best;
}

// The decode side: obeys "EXPECT tid n dst..." lines, answers "DONE tid code ns".
int run_receiver(const std::map<std::string, std::string>& a) {
  const Model* model = nullptr;
  for (const Model& m : kModels) {
    if (a.at("model") == m.name) model = &m;
  }
  KvLayout layout =
      layout_for(*model, std::stoi(a.at("block-size")), std::stoi(a.at("num-blocks")));
  // --ucx-pool 1: UCX allocates the pool (shared memory on one host).
  auto pool = make_pool(a, layout.total_bytes());
  if (!pool.is_ok()) {
    std::cout << "ERR " << pool.status().to_string() << std::endl;
    return 1;
  }
  auto engine = TransferEngine::create(config_from(a, "decode"), layout, pool->data,
                                       layout.total_bytes(), std::move(pool->copier));
  if (!engine.is_ok()) {
    std::cout << "ERR " << engine.status().to_string() << std::endl;
    return 1;
  }
  std::mutex out;
  std::cout << "DESC " << hex((*engine)->descriptor()) << std::endl;
  std::string line;
  while (std::getline(std::cin, line)) {
    std::istringstream in(line);
    std::string cmd;
    in >> cmd;
    if (cmd == "QUIT") break;
    if (cmd == "PEER") {
      std::string h;
      in >> h;
      auto p = (*engine)->add_peer(unhex(h));
      std::cout << (p.is_ok() ? "PEER_OK" : "ERR " + p.status().to_string()) << std::endl;
    } else if (cmd == "EXPECT") {
      RecvSpec spec;
      size_t n;
      in >> spec.transfer_id >> n;
      spec.request_id = spec.transfer_id;
      spec.dst_blocks.resize(n);
      for (auto& b : spec.dst_blocks) in >> b;
      std::vector<int32_t> wire;
      Status s = (*engine)->expect(
          std::move(spec),
          [&](const TransferResult& r) {
            int64_t t = now_ns();
            std::lock_guard lock(out);
            std::cout << "DONE " << r.transfer_id << " " << int(r.status.code()) << " " << t
                      << std::endl;
          },
          &wire);
      std::lock_guard lock(out);
      if (!s.is_ok()) {
        std::cout << "ERR " << s.to_string() << std::endl;
        continue;
      }
      // The blocks the sender is to write: these, or a staged pool's slots.
      std::cout << "READY";
      for (int32_t b : wire) std::cout << ' ' << b;
      std::cout << std::endl;
    }
  }
  engine->reset();
  return 0;
}

class ReceiverProcess {
 public:
  explicit ReceiverProcess(std::vector<std::string> argv) {
    int in[2], out[2];
    if (pipe(in) != 0 || pipe(out) != 0) std::abort();
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, in[0], 0);
    posix_spawn_file_actions_adddup2(&fa, out[1], 1);
    posix_spawn_file_actions_addclose(&fa, in[1]);
    posix_spawn_file_actions_addclose(&fa, out[0]);
    std::vector<char*> args;
    for (auto& s : argv) args.push_back(s.data());
    args.push_back(nullptr);
    if (posix_spawn(&pid_, args[0], &fa, nullptr, args.data(), environ) != 0) std::abort();
    posix_spawn_file_actions_destroy(&fa);
    close(in[0]);
    close(out[1]);
    to_ = fdopen(in[1], "w");
    from_ = fdopen(out[0], "r");
  }
  ~ReceiverProcess() {
    send("QUIT");
    fclose(to_);
    int st;
    waitpid(pid_, &st, 0);
    fclose(from_);
  }
  void send(const std::string& s) {
    std::fputs((s + "\n").c_str(), to_);
    std::fflush(to_);
  }
  std::string line() {
    std::string s;
    int c;
    while ((c = std::fgetc(from_)) != EOF && c != '\n') s += char(c);
    return s;
  }

 private:
  pid_t pid_ = -1;
  FILE* to_ = nullptr;
  FILE* from_ = nullptr;
};

struct Sample {
  double seconds;       // first post -> receiver notified
  double tail_seconds;  // last layer posted -> receiver notified
  uint32_t ops;
};

}  // namespace

int main(int argc, char** argv) {
  // UCX logs to stdout, where the receiver speaks its line protocol (and
  // this process prints its table): its warnings go to stderr instead.
  // The receiver inherits the setting.
  (void)::setenv("UCX_LOG_FILE", "stderr", /*overwrite=*/0);
  auto a = parse_args(argc, argv);
  init_logging(a.at("receiver") == "1" ? "bench-decode" : "bench-prefill");
  (void)set_log_level("warn");
  if (a.at("receiver") == "1") return run_receiver(a);

  int iters = std::stoi(a.at("iters"));
  bool streamed = a.at("streamed") == "1";
  bool fragmented = a.at("fragmented") == "1";
  auto gap = std::chrono::microseconds(std::stoi(a.at("layer-gap-us")));
  std::printf(
      "| transport | peer errors | mode | pool | model | block | tokens | MiB | ops | op size KiB "
      "| "
      "MB/s median | MB/s best | last layer -> notified ms | copier out / in MB/s |\n"
      "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (const std::string& model_name : split(a.at("models"), ',')) {
    const Model* model = nullptr;
    for (const Model& m : kModels) {
      if (model_name == m.name) model = &m;
    }
    if (model == nullptr) {
      std::fprintf(stderr, "unknown model %s\n", model_name.c_str());
      return 2;
    }
    for (const std::string& bs : split(a.at("block-sizes"), ',')) {
      for (const std::string& tok : split(a.at("tokens"), ',')) {
        int32_t block_size = std::stoi(bs), tokens = std::stoi(tok);
        int32_t blocks = (tokens + block_size - 1) / block_size;
        // Fragmented: the request's blocks are scattered over a pool twice its size.
        int32_t pool_blocks = fragmented ? 2 * blocks : blocks;
        KvLayout layout = layout_for(*model, block_size, pool_blocks);
        auto pool = make_pool(a, layout.total_bytes());
        if (!pool.is_ok()) {
          std::fprintf(stderr, "%s\n", pool.status().to_string().c_str());
          return 1;
        }
        // With a copier of its own: a copier pins one region, and the
        // engine's pins its slots.
        CopierRate staging;
        if (pool->copier != nullptr)
          staging = copier_rate(a.at("pool"), pool->data, layout.total_bytes());
        auto engine = TransferEngine::create(config_from(a, "prefill"), layout, pool->data,
                                             layout.total_bytes(), std::move(pool->copier));
        if (!engine.is_ok()) {
          std::fprintf(stderr, "%s\n", engine.status().to_string().c_str());
          return 1;
        }
        if (pool->data == nullptr) std::memset((*engine)->pool(), 0x5a, layout.total_bytes());
        std::vector<std::string> rargv = {"/proc/self/exe",
                                          "--receiver",
                                          "1",
                                          "--model",
                                          model_name,
                                          "--block-size",
                                          bs,
                                          "--num-blocks",
                                          std::to_string(pool_blocks)};
        for (const char* k : {"tls", "mode", "verify", "peer-errors", "net-devices", "ucx-pool",
                              "pool", "staging-blocks"}) {
          rargv.push_back(std::string("--") + k);
          rargv.push_back(a.at(k));
        }
        // The receiver is this program again; BATON_BENCH_TRANSFER_SELF names
        // another way to start it (a wrapper that runs it through a bundled
        // loader, as deploy/gpu_check.sh does).
        const char* self = std::getenv("BATON_BENCH_TRANSFER_SELF");
        rargv[0] = self != nullptr ? self : argv[0];
        ReceiverProcess receiver(rargv);
        std::string desc = receiver.line();
        if (desc.rfind("DESC ", 0) != 0) {
          std::fprintf(stderr, "receiver failed: %s\n", desc.c_str());
          return 1;
        }
        PeerId peer = *(*engine)->add_peer(unhex(desc.substr(5)));
        receiver.send("PEER " + hex((*engine)->descriptor()));
        receiver.line();

        std::mt19937 rng(42);
        std::vector<Sample> samples;
        for (int it = 0; it <= iters; ++it) {  // iteration 0 warms up the endpoint
          std::vector<int32_t> src(blocks), dst(blocks);
          for (int32_t i = 0; i < blocks; ++i) src[i] = dst[i] = i;
          if (fragmented) {
            std::vector<int32_t> all(pool_blocks);
            for (int32_t i = 0; i < pool_blocks; ++i) all[i] = i;
            std::shuffle(all.begin(), all.end(), rng);
            dst.assign(all.begin(), all.begin() + blocks);
            std::shuffle(all.begin(), all.end(), rng);
            src.assign(all.begin(), all.begin() + blocks);
          }
          uint64_t tid = uint64_t(it) + 1;
          std::string cmd = "EXPECT " + std::to_string(tid) + " " + std::to_string(blocks);
          for (int32_t b : dst) {
            cmd +=
                ' ';  // not `" " + to_string(b)`: GCC 12 warns there (-Wrestrict, a false positive)
            cmd += std::to_string(b);
          }
          receiver.send(cmd);
          std::istringstream ready(receiver.line());
          std::string word;
          ready >> word;
          std::vector<int32_t> wire;
          for (int32_t b; ready >> b;) wire.push_back(b);
          if (word != "READY" || wire.size() != dst.size()) {
            std::fprintf(stderr, "cannot measure: the receiver did not take transfer %llu\n",
                         static_cast<unsigned long long>(tid));
            return 1;
          }
          std::mutex m;
          std::condition_variable cv;
          bool done = false;
          TransferResult result;
          auto on_done = [&](const TransferResult& r) {
            std::lock_guard lock(m);
            result = r;
            done = true;
            cv.notify_all();
          };
          SendSpec spec{tid, tid, src, wire, 0, -1, std::nullopt};
          int64_t start = now_ns(), last_posted = start;
          if (!streamed) {
            (void)(*engine)->write_blocks(peer, std::move(spec), on_done);
            last_posted = start;
          } else {
            (void)(*engine)->begin_send(peer, std::move(spec), on_done);
            for (int32_t l = 1; l <= layout.num_layers; ++l) {
              if (gap.count() > 0) std::this_thread::sleep_for(gap);  // "computing" layer l
              last_posted = now_ns();
              (void)(*engine)->post_layers(tid, l);
            }
          }
          std::string reply = receiver.line();
          std::istringstream in(reply);
          uint64_t rtid = 0;
          int code = -1;
          int64_t finished = 0;
          const bool parsed = bool(in >> word >> rtid >> code >> finished) && word == "DONE";
          {
            std::unique_lock lock(m);
            cv.wait(lock, [&] { return done; });
          }
          if (!parsed) {
            std::fprintf(stderr,
                         "cannot measure: the receiver answered '%s' where the DONE line of "
                         "transfer %llu was due\n",
                         reply.c_str(), static_cast<unsigned long long>(tid));
            return 1;
          }
          if (code != 0 || !result.status.is_ok()) {
            std::fprintf(stderr, "cannot measure: transfer failed: %s / receiver code %d\n",
                         result.status.to_string().c_str(), code);
            return 1;
          }
          // The receiver's clock is this host's monotonic clock: a completion
          // before the send began means the two do not share one, and no
          // time it gives can be trusted.
          if (finished < last_posted || rtid != tid) {
            std::fprintf(stderr,
                         "cannot measure: the receiver reported transfer %llu done at %lld ns, "
                         "before the send began (%lld ns)\n",
                         static_cast<unsigned long long>(rtid), static_cast<long long>(finished),
                         static_cast<long long>(start));
            return 1;
          }
          if (it > 0) {
            samples.push_back({double(finished - start) * 1e-9,
                               double(finished - last_posted) * 1e-9, result.ops});
          }
          if (it == iters) {
            std::sort(samples.begin(), samples.end(),
                      [](const Sample& x, const Sample& y) { return x.seconds < y.seconds; });
            const Sample& med = samples[samples.size() / 2];
            std::vector<double> tails;
            for (auto& s : samples) tails.push_back(s.tail_seconds);
            std::sort(tails.begin(), tails.end());
            double bytes = double(blocks) * layout.block_bytes() * layout.num_layers;
            const std::string copier = staging.out > 0
                                           ? std::to_string(int64_t(staging.out)) + " / " +
                                                 std::to_string(int64_t(staging.in))
                                           : "-";
            std::printf(
                "| %s | %s | %s | %s | %s | %d | %d | %.1f | %u | %.0f | %.0f | %.0f | %.2f | %s "
                "|\n",
                a.at("tls").c_str(), a.at("peer-errors") == "1" ? "on" : "off",
                transfer_mode_name(result.mode).data(), a.at("pool").c_str(), model_name.c_str(),
                block_size, tokens, bytes / (1 << 20), med.ops, bytes / med.ops / 1024,
                bytes / med.seconds / (1 << 20), bytes / samples.front().seconds / (1 << 20),
                tails[tails.size() / 2] * 1e3, copier.c_str());
            std::fflush(stdout);
          }
        }
      }
    }
  }
  return 0;
}
