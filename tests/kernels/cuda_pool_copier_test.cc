// The CUDA pool copier (kernels/cuda/pool_copier.h): random ranges out of and
// into a device pool land exactly where they should and nowhere else. Skips
// on the declared capability check without a device.
#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "kernels/cuda/device.h"
#include "kernels/cuda/pool_copier.h"
#include "tests/cuda_device_check.h"

namespace baton::kernels::cuda {
namespace {

constexpr uint8_t kPoison = 0xA5;

class CudaPoolCopierTest : public ::testing::Test {
 protected:
  void SetUp() override { BATON_SKIP_WITHOUT_NVIDIA_GPU(); }
};

// Disjoint random ranges inside `bytes`, in random order; on the host side
// at the same offsets or packed in that random order (slots).
std::vector<PoolCopier::Range> random_ranges(std::mt19937_64& rng, size_t bytes, bool packed) {
  std::vector<PoolCopier::Range> ranges;
  size_t at = 0;
  while (true) {
    at += rng() % 70000;
    size_t n = 1 + rng() % 200000;
    if (at + n > bytes) break;
    ranges.push_back({.offset = at, .bytes = n, .host_offset = at});
    at += n;
  }
  std::shuffle(ranges.begin(), ranges.end(), rng);
  if (packed) {
    size_t host = 0;
    for (auto& r : ranges) {
      r.host_offset = host;
      host += r.bytes;
    }
  }
  return ranges;
}

// A device pool of `bytes` random bytes (also kept on the host, in
// `bytes_on_device`) and its copier.
struct RandomPool {
  std::vector<uint8_t> bytes_on_device;
  DeviceBuffer pool;
  std::unique_ptr<PoolCopier> copier;
};
Result<RandomPool> random_pool(std::mt19937_64& rng, size_t bytes) {
  RandomPool p;
  p.bytes_on_device.resize(bytes);
  for (auto& b : p.bytes_on_device) b = uint8_t(rng());
  BATON_ASSIGN_OR_RETURN(p.pool, DeviceBuffer::allocate(bytes));
  BATON_RETURN_IF_ERROR(p.pool.copy_from_host(p.bytes_on_device.data(), bytes));
  BATON_ASSIGN_OR_RETURN(p.copier, make_pool_copier(p.pool.data(), bytes));
  return p;
}

TEST_F(CudaPoolCopierTest, CopiesExactlyTheRangesBothWays) {
  const uint64_t seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  constexpr size_t kBytes = 24 << 20;
  // Pinned host memory takes one batched call (cudaMemcpyBatchAsync where
  // the runtime has it), pageable a call per range.
  for (const auto& [packed, pinned] :
       {std::pair{false, true}, std::pair{true, true}, std::pair{true, false}}) {
    SCOPED_TRACE(std::string(packed ? "host side packed" : "host side at the pool's offsets") +
                 (pinned ? ", pinned" : ", pageable"));
    auto made = random_pool(rng, kBytes);
    ASSERT_TRUE(made.is_ok()) << made.status().to_string();
    std::vector<uint8_t>& device_bytes = made->bytes_on_device;
    DeviceBuffer* pool = &made->pool;
    std::unique_ptr<PoolCopier>* copier = &made->copier;

    std::vector<uint8_t> host(kBytes, kPoison);
    if (pinned) {
      EXPECT_TRUE((*copier)->pin(host.data(), kBytes).is_ok());
    }
    auto out = random_ranges(rng, kBytes, packed);
    ASSERT_TRUE((*copier)->to_host(host.data(), out).is_ok());
    std::vector<uint8_t> want(kBytes, kPoison);
    for (const auto& r : out) {
      std::copy_n(device_bytes.begin() + r.offset, r.bytes, want.begin() + r.host_offset);
    }
    EXPECT_TRUE(host == want) << "copy-out wrote outside its ranges or missed bytes";

    // Into the device: fresh bytes on the host, other ranges.
    for (auto& b : host) b = uint8_t(rng());
    auto in = random_ranges(rng, kBytes, packed);
    ASSERT_TRUE((*copier)->to_device(host.data(), in).is_ok());
    for (const auto& r : in) {
      std::copy_n(host.begin() + r.host_offset, r.bytes, device_bytes.begin() + r.offset);
    }
    std::vector<uint8_t> got(kBytes);
    ASSERT_TRUE(pool->copy_to_host(got.data(), kBytes).is_ok());
    EXPECT_TRUE(got == device_bytes) << "copy-in wrote outside its ranges or missed bytes";

    PoolCopier::Range past{.offset = kBytes - 8, .bytes = 16, .host_offset = 0};
    EXPECT_EQ((*copier)->to_host(host.data(), {&past, 1}).code(), StatusCode::kOutOfRange);
    if (pinned) {  // the host memory's size is known once pin() named it
      PoolCopier::Range host_past{.offset = 0, .bytes = 16, .host_offset = kBytes - 8};
      EXPECT_EQ((*copier)->to_device(host.data(), {&host_past, 1}).code(), StatusCode::kOutOfRange);
    }
    copier->reset();  // unpins before the host memory goes
  }
}

// Threads copying at once, each its own part of the pool both ways (as a
// prefill's copy-out, the SSD tier and the transfer engine's copy-in do),
// more threads than a direction has streams: every byte lands where its
// thread put it.
TEST_F(CudaPoolCopierTest, ThreadsCopyingAtOnceEachGetTheirOwnBytes) {
  const uint64_t seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  constexpr size_t kThreads = 8, kPart = 4 << 20, kBytes = kThreads * kPart;
  std::mt19937_64 rng(seed);
  auto made = random_pool(rng, kBytes);
  ASSERT_TRUE(made.is_ok()) << made.status().to_string();
  const std::vector<uint8_t>& device_bytes = made->bytes_on_device;
  DeviceBuffer* pool = &made->pool;
  std::unique_ptr<PoolCopier>* copier = &made->copier;
  std::vector<uint8_t> host(kBytes, kPoison);
  EXPECT_TRUE((*copier)->pin(host.data(), kBytes).is_ok());
  // Odd threads write fresh bytes into their part of the pool; even ones
  // read theirs out; each 20 times, in ranges of a few KiB.
  for (size_t t = 1; t < kThreads; t += 2) {
    for (size_t i = t * kPart; i < (t + 1) * kPart; ++i) host[i] = uint8_t(rng());
  }
  std::vector<std::thread> threads;
  std::vector<Status> results(kThreads, Status::ok());
  for (size_t t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::vector<PoolCopier::Range> ranges;
      for (size_t at = t * kPart; at < (t + 1) * kPart; at += 4096 + 512) {
        const size_t n = std::min<size_t>(4096, (t + 1) * kPart - at);
        ranges.push_back({.offset = at, .bytes = n, .host_offset = at});
      }
      for (int round = 0; round < 20 && results[t].is_ok(); ++round) {
        results[t] = t % 2 == 1 ? (*copier)->to_device(host.data(), ranges)
                                : (*copier)->to_host(host.data(), ranges);
      }
    });
  }
  for (auto& thread : threads) thread.join();
  for (size_t t = 0; t < kThreads; ++t) EXPECT_TRUE(results[t].is_ok()) << results[t].to_string();
  std::vector<uint8_t> got(kBytes);
  ASSERT_TRUE(pool->copy_to_host(got.data(), kBytes).is_ok());
  for (size_t t = 0; t < kThreads; ++t) {
    SCOPED_TRACE("thread " + std::to_string(t));
    for (size_t at = t * kPart; at < (t + 1) * kPart; at += 4096 + 512) {
      const size_t n = std::min<size_t>(4096, (t + 1) * kPart - at);
      const bool into_pool = t % 2 == 1;
      const uint8_t* want = into_pool ? &host[at] : &device_bytes[at];
      const uint8_t* seen = into_pool ? &got[at] : &host[at];
      ASSERT_TRUE(std::equal(want, want + n, seen)) << "bytes at " << at;
      // The gap after the range: untouched on the side written.
      const size_t gap_end = std::min((t + 1) * kPart, at + 4096 + 512);
      for (size_t i = at + n; i < gap_end; ++i) {
        ASSERT_EQ(into_pool ? got[i] : host[i], into_pool ? device_bytes[i] : kPoison)
            << "written outside the ranges at " << i;
      }
    }
  }
  copier->reset();  // unpins before the host memory goes
}

// Host memory another copier (or a UCX with CUDA support) pinned already
// serves as pinned, and stays pinned for its owner when this copier goes.
TEST_F(CudaPoolCopierTest, HostMemoryPinnedBeforeServesAsPinned) {
  constexpr size_t kBytes = 4 << 20;
  std::mt19937_64 rng(std::random_device{}());
  auto pool = DeviceBuffer::allocate(kBytes);
  ASSERT_TRUE(pool.is_ok()) << pool.status().to_string();
  auto owner = make_pool_copier(pool->data(), kBytes);
  auto second = make_pool_copier(pool->data(), kBytes);
  ASSERT_TRUE(owner.is_ok() && second.is_ok());
  std::vector<uint8_t> host(kBytes);
  ASSERT_TRUE((*owner)->pin(host.data(), kBytes).is_ok());
  EXPECT_TRUE((*second)->pin(host.data(), kBytes).is_ok());
  for (auto* copier : {&*second, &*owner}) {
    for (auto& b : host) b = uint8_t(rng());
    const std::vector<uint8_t> sent = host;
    auto ranges = random_ranges(rng, kBytes, true);
    ASSERT_TRUE((*copier)->to_device(host.data(), ranges).is_ok());
    std::fill(host.begin(), host.end(), kPoison);
    ASSERT_TRUE((*copier)->to_host(host.data(), ranges).is_ok());
    for (const auto& r : ranges) {
      ASSERT_TRUE(std::equal(host.begin() + r.host_offset, host.begin() + r.host_offset + r.bytes,
                             sent.begin() + r.host_offset));
    }
    const bool owner_left = copier == &*second;
    copier->reset();  // the second goes first: the owner copies on after it
    // Registered while its owner copies; unregistered once the owner is gone.
    unsigned int flags = 0;
    const cudaError_t registered = cudaHostGetFlags(&flags, host.data());
    (void)cudaGetLastError();
    EXPECT_EQ(registered == cudaSuccess, owner_left)
        << (owner_left ? "the second copier unregistered its owner's memory"
                       : "the owner left its memory registered");
  }
}

TEST_F(CudaPoolCopierTest, RefusesHostMemory) {
  std::vector<uint8_t> host(4096);
  EXPECT_FALSE(make_pool_copier(host.data(), host.size()).is_ok());
  EXPECT_FALSE(make_pool_copier(nullptr, 4096).is_ok());
}

}  // namespace
}  // namespace baton::kernels::cuda
