// bench/ssd_tier_bench.cc — the prefix cache's SSD tier moving batches of KV
// blocks of real model shapes, beside the machine's own ceilings.
//
// Save: an allocation's evictions written out (fresh keys each iteration,
// so every block is written). Restore: a prompt's blocks read back into the
// pool and verified (XXH3 of every byte). Two cases for restores:
//  * warm — the file's pages are in the page cache, as with a tier smaller
//    than free memory: the ceiling is the measured memory copy bandwidth
//    (STREAM copy; read + written bytes, so a copy at the ceiling moves
//    half its figure in payload);
//  * cold — the file's pages are dropped (fdatasync, POSIX_FADV_DONTNEED)
//    before each iteration, so reads come from the device: the ceiling is
//    the device's sequential read rate, measured the same way on a scratch
//    file of 256 MiB in the same directory.
//
//   ./build/bench/ssd_tier_bench [--benchmark_filter=...]
// The tier's file goes to $BATON_BENCH_SSD_DIR (default: the temp directory).
#include <benchmark/benchmark.h>
#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <list>
#include <random>
#include <string>
#include <vector>

#include "bench/bench_flags.h"
#include "bench/ceilings.h"
#include "bench/manual_time.h"
#include "engine/kv_pool.h"
#include "engine/ssd_kv_store.h"

namespace baton::bench {
namespace {

namespace fs = std::filesystem;

struct Shape {
  const char* name;
  int32_t layers, kv_heads, head_dim;
};
constexpr Shape kShapes[] = {
    {"smollm2-135m", 30, 3, 64},
    {"qwen2.5-0.5b", 24, 2, 64},
    {"llama3-8b", 32, 8, 128},
};
constexpr int32_t kBlockSize = 16;

fs::path bench_dir() {
  const char* env = std::getenv("BATON_BENCH_SSD_DIR");
  return env != nullptr ? fs::path(env) : fs::temp_directory_path();
}

KvLayout layout_of(const Shape& s, int32_t blocks) {
  return KvLayout{.num_layers = s.layers,
                  .num_blocks = blocks,
                  .block_size = kBlockSize,
                  .num_kv_heads = s.kv_heads,
                  .head_dim = s.head_dim,
                  .dtype = DType::kBF16};
}

// Writes what the page cache holds of `file` to the device and drops it.
void drop_from_page_cache(const fs::path& file) {
  const int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return;
  ::fdatasync(fd);
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
}

// Sequential 1 MiB reads of a 256 MiB scratch file not in the page cache.
double device_read_gbs() {
  static const double gbs = [] {
    const fs::path file = bench_dir() / ("baton-ssd-ceiling-" + std::to_string(::getpid()));
    constexpr size_t kChunk = 1 << 20, kChunks = 256;
    std::vector<char> buffer(kChunk, 'x');
    int fd = ::open(file.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) return 0.0;
    for (size_t i = 0; i < kChunks; ++i) {
      if (::write(fd, buffer.data(), kChunk) != ssize_t(kChunk)) break;
    }
    ::close(fd);
    double best = 0.0;
    for (int pass = 0; pass < 3; ++pass) {
      drop_from_page_cache(file);
      fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
      const auto start = std::chrono::steady_clock::now();
      size_t total = 0;
      for (ssize_t n; (n = ::read(fd, buffer.data(), kChunk)) > 0;) total += size_t(n);
      const double s =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      ::close(fd);
      best = std::max(best, double(total) / s / 1e9);
    }
    fs::remove(file);
    return best;
  }();
  return gbs;
}

struct Fixture {
  explicit Fixture(const Shape& shape, int32_t batch) {
    auto made = engine::KvPool::create(layout_of(shape, 2 * batch));
    if (!made.is_ok()) std::abort();
    pool = std::make_unique<engine::KvPool>(std::move(made).value());
    std::mt19937_64 rng(7);
    auto* words = static_cast<uint64_t*>(pool->data());
    for (size_t i = 0; i < pool->bytes() / 8; ++i) words[i] = rng();
    const uint64_t slot = engine::SsdKvStore::slot_bytes_for(pool->layout());
    auto created =
        engine::SsdKvStore::create(bench_dir(), slot * uint64_t(4 * batch), pool->layout());
    if (!created.is_ok()) {
      std::fprintf(stderr, "%s\n", created.status().to_string().c_str());
      std::abort();
    }
    store = std::move(created).value();
  }
  // `batch` new keys (hash and tokens from `serial`) for blocks 0..batch-1.
  void make_keys(int32_t batch, uint64_t serial) {
    keys.clear();
    tokens.clear();
    blocks.clear();
    for (int32_t i = 0; i < batch; ++i) {
      auto& t = tokens.emplace_back(size_t(kBlockSize), int32_t(serial));
      t[0] = i;
      keys.push_back({.hash = serial * 1000003 + uint64_t(i), .parent = serial, .tokens = t});
      blocks.push_back(i);
    }
  }
  double payload_bytes(int32_t batch) const {
    return double(batch) * double(pool->layout().num_layers) * double(pool->layout().block_bytes());
  }

  std::unique_ptr<engine::KvPool> pool;
  std::unique_ptr<engine::SsdKvStore> store;
  std::list<std::vector<int32_t>> tokens;
  std::vector<engine::BlockKey> keys;
  std::vector<int32_t> blocks;
};

void report(benchmark::State& state, double bytes, double seconds, double ceiling_gbs,
            const char* ceiling_name) {
  const double gbs = seconds > 0 ? bytes / seconds / 1e9 : 0.0;
  state.counters["GB/s"] = gbs;
  state.counters[ceiling_name] = ceiling_gbs;
  state.counters["of_ceiling"] = ceiling_gbs > 0 ? gbs / ceiling_gbs : 0.0;
  state.counters["ms/block"] =
      seconds * 1e3 / double(state.range(1)) / double(std::max<int64_t>(1, state.iterations()));
}

void BM_SsdSave(benchmark::State& state) {
  const Shape& shape = kShapes[state.range(0)];
  const auto batch = int32_t(state.range(1));
  Fixture f(shape, batch);
  state.SetLabel(shape.name);
  uint64_t serial = 1;
  double seconds = 0.0;
  for (auto _ : state) {
    f.make_keys(batch, serial++);
    time_iteration(state, seconds, [&] { f.store->save(f.keys, f.pool->data(), f.blocks); });
  }
  // Writes land in the page cache: memory copy bandwidth is their ceiling.
  report(state, f.payload_bytes(batch) * double(state.iterations()), seconds,
         measure_memory_bandwidth().copy_gbs, "copy_GB/s");
}

void BM_SsdRestore(benchmark::State& state) {
  const Shape& shape = kShapes[state.range(0)];
  const auto batch = int32_t(state.range(1));
  const bool cold = state.range(2) != 0;
  Fixture f(shape, batch);
  state.SetLabel(std::string(shape.name) + (cold ? " cold" : " warm"));
  f.make_keys(batch, 1);
  f.store->save(f.keys, f.pool->data(), f.blocks);
  // Into the other half of the pool, as a restore takes fresh blocks.
  std::vector<int32_t> into;
  for (int32_t i = 0; i < batch; ++i) into.push_back(batch + i);
  double seconds = 0.0;
  for (auto _ : state) {
    if (cold) drop_from_page_cache(f.store->path());
    time_iteration(state, seconds, [&] {
      const engine::SsdLoad loaded = f.store->load(f.keys, f.pool->data(), into);
      if (loaded.restored != batch) state.SkipWithError("restore fell short");
    });
  }
  const double bytes = f.payload_bytes(batch) * double(state.iterations());
  if (cold) {
    report(state, bytes, seconds, device_read_gbs(), "device_GB/s");
  } else {
    report(state, bytes, seconds, measure_memory_bandwidth().copy_gbs, "copy_GB/s");
  }
}

// Shapes 0-2; 64 blocks (1024 tokens) of the small models, 16 of llama3-8b.
void shape_args(benchmark::internal::Benchmark* b, bool restore) {
  for (int64_t shape = 0; shape < 3; ++shape) {
    const int64_t batch = shape == 2 ? 16 : 64;
    if (restore) {
      b->Args({shape, batch, 0})->Args({shape, batch, 1});
    } else {
      b->Args({shape, batch});
    }
  }
}

BENCHMARK(BM_SsdSave)->Apply([](auto* b) {
                       shape_args(b, false);
                     }) -> UseManualTime() -> Unit(benchmark::kMillisecond);
BENCHMARK(BM_SsdRestore)->Apply([](auto* b) {
                          shape_args(b, true);
                        }) -> UseManualTime() -> Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace baton::bench

int main(int argc, char** argv) {
  baton::bench::take_bench_flags(&argc, argv);
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
