// Two-process transfer tests over real UCX on loopback: this process is one
// node (an in-process TransferEngine), tests/kv_transfer/transfer_peer.cc the
// other. Every run draws fresh block lists and bytes; the seed is printed.
#include <gtest/gtest.h>
#include <sys/mman.h>

#include <condition_variable>
#include <map>
#include <mutex>
#include <random>
#include <thread>

#include "common/logging.h"
#include "kv_transfer/transfer_engine.h"
#include "kv_transfer/wire.h"
#include "tests/kv_transfer/kv_test_util.h"

namespace baton::kv_transfer {
namespace {

using namespace std::chrono_literals;
using testing::Child;

struct Transport {
  const char* name;
  const char* tls;
};

const Transport kTransports[] = {{"tcp", "tcp"}, {"shm", "sm,self"}};

uint64_t test_seed() {
  static uint64_t seed = [] {
    uint64_t s = std::random_device{}() | 1;
    std::printf("kv_transfer test seed: %llu\n", (unsigned long long)s);
    return s;
  }();
  return seed;
}

KvLayout make_layout(DType dtype, int32_t num_blocks = 64, int32_t layers = 4) {
  KvLayout l;
  l.num_layers = layers;
  l.num_blocks = num_blocks;
  l.block_size = 16;
  l.num_kv_heads = 2;
  l.head_dim = 32;
  l.dtype = dtype;
  return l;
}

// Completion mailbox: callbacks post, the test waits.
class Mailbox {
 public:
  void post(const TransferResult& r) {
    std::lock_guard lock(mutex_);
    results_[r.transfer_id] = r;
    cv_.notify_all();
  }
  std::optional<TransferResult> wait(uint64_t id, std::chrono::milliseconds timeout = 20s) {
    std::unique_lock lock(mutex_);
    if (!cv_.wait_for(lock, timeout, [&] { return results_.count(id) != 0; })) return std::nullopt;
    return results_[id];
  }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  std::map<uint64_t, TransferResult> results_;
};

// This process's node: a pool (pattern-filled or poisoned) and an engine.
class LocalNode {
 public:
  LocalNode(const KvLayout& layout, const char* tls, uint64_t seed, const char* name,
            std::chrono::milliseconds deadline = 3000ms)
      : layout_(layout), bytes_(layout.total_bytes()) {
    pool_ = static_cast<uint8_t*>(
        mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
    if (seed != 0) {
      testing::fill_pattern(pool_, bytes_, seed);
    } else {
      std::memset(pool_, testing::kPoison, bytes_);
    }
    TransferConfig config;
    config.ucx_env["UCX_TLS"] = tls;
    config.node_name = name;
    config.default_deadline = deadline;
    auto e = TransferEngine::create(config, layout, pool_, bytes_);
    EXPECT_TRUE(e.is_ok()) << e.status().to_string();
    if (e.is_ok()) engine_ = std::move(e).value();
  }
  ~LocalNode() {
    engine_.reset();
    munmap(pool_, bytes_);
  }
  TransferEngine& engine() { return *engine_; }
  uint8_t* pool() { return pool_; }
  Mailbox& mail() { return mail_; }
  TransferCallback callback() {
    return [this](const TransferResult& r) { mail_.post(r); };
  }

 private:
  KvLayout layout_;
  size_t bytes_;
  uint8_t* pool_ = nullptr;
  std::unique_ptr<TransferEngine> engine_;
  Mailbox mail_;
};

std::unique_ptr<Child> spawn_peer(const char* tls, const KvLayout& l, uint64_t seed,
                                  uint64_t peer_seed, int32_t peer_num_blocks,
                                  const char* mode = "auto") {
  auto child = std::make_unique<Child>(std::vector<std::string>{
      BATON_TRANSFER_PEER, tls, mode, std::to_string(l.num_layers), std::to_string(l.num_blocks),
      std::to_string(l.block_size), std::to_string(l.num_kv_heads), std::to_string(l.head_dim),
      std::string(dtype_name(l.dtype)), std::to_string(seed), std::to_string(peer_seed),
      std::to_string(peer_num_blocks)});
  return child;
}

std::string join(const std::vector<int32_t>& v) {
  std::string s;
  for (int32_t x : v) s += " " + std::to_string(x);
  return s;
}

std::string expect_line(uint64_t req, uint64_t tid, int lb, int le, int deadline_ms,
                        const std::vector<int32_t>& src, const std::vector<int32_t>& dst) {
  return "EXPECT " + std::to_string(req) + " " + std::to_string(tid) + " " + std::to_string(lb) +
         " " + std::to_string(le) + " " + std::to_string(deadline_ms) + " " +
         std::to_string(src.size()) + join(src) + join(dst);
}

// Connects local node -> child: each learns the other's descriptor.
PeerId connect(LocalNode& local, Child& child) {
  auto desc = child.wait_for("DESC ");
  EXPECT_TRUE(desc.has_value()) << "peer process did not start";
  if (!desc) return 0;
  auto peer = local.engine().add_peer(testing::from_hex(desc->substr(5)));
  EXPECT_TRUE(peer.is_ok()) << peer.status().to_string();
  child.send("PEER " + testing::to_hex(local.engine().descriptor()));
  EXPECT_TRUE(child.wait_for("PEER_OK").has_value());
  return peer.is_ok() ? *peer : 0;
}

size_t merged_runs(const std::vector<int32_t>& src, const std::vector<int32_t>& dst) {
  size_t runs = 0;
  for (size_t i = 0; i < src.size(); ++i) {
    if (i == 0 || src[i] != src[i - 1] + 1 || dst[i] != dst[i - 1] + 1) ++runs;
  }
  return runs;
}

class TransferTest : public ::testing::TestWithParam<Transport> {
 protected:
  void SetUp() override { rng_.seed(test_seed() ^ std::hash<std::string>{}(test_name())); }
  static std::string test_name() {
    return ::testing::UnitTest::GetInstance()->current_test_info()->name();
  }
  std::mt19937_64 rng_;
};

// Random non-contiguous block lists on both sides, every dtype, several layers;
// the receiver checks every destination byte and that nothing else changed.
TEST_P(TransferTest, RandomBlocksEveryDtypeVerifiedOnReceiver) {
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
    SCOPED_TRACE(std::string(dtype_name(dtype)));
    KvLayout sender_layout = make_layout(dtype, 96, 5);
    KvLayout receiver_layout = make_layout(dtype, 80, 5);  // pools may differ in size
    uint64_t seed = rng_() | 1;
    LocalNode sender(sender_layout, GetParam().tls, seed, "sender");
    auto receiver = spawn_peer(GetParam().tls, receiver_layout, 0, seed, sender_layout.num_blocks);
    PeerId peer = connect(sender, *receiver);
    for (uint64_t tid = 1; tid <= 3; ++tid) {
      int32_t n = 8 + int32_t(rng_() % 24);
      auto src = testing::random_blocks(rng_, sender_layout.num_blocks, n);
      auto dst = testing::random_blocks(rng_, receiver_layout.num_blocks, n);
      int lb = int(rng_() % 2), le = 5 - int(rng_() % 2);
      receiver->send(expect_line(100 + tid, tid, lb, le, 5000, src, dst));
      ASSERT_TRUE(receiver->wait_for("EXPECT_OK"));
      SendSpec spec{100 + tid, tid, src, dst, lb, le, std::nullopt};
      ASSERT_TRUE(sender.engine().write_blocks(peer, spec, sender.callback()).is_ok());
      auto sent = sender.mail().wait(tid);
      ASSERT_TRUE(sent.has_value());
      EXPECT_TRUE(sent->status.is_ok()) << sent->status.to_string();
      EXPECT_EQ(sent->ops, merged_runs(src, dst) * size_t(le - lb));
      EXPECT_EQ(sent->bytes, src.size() * sender_layout.block_bytes() * size_t(le - lb));
      auto recv = receiver->wait_for("RECV " + std::to_string(tid) + " ");
      ASSERT_TRUE(recv.has_value());
      auto w = testing::split(*recv);
      EXPECT_EQ(w[2], "0") << *recv;                       // StatusCode::kOk
      EXPECT_EQ(w[3], std::to_string(sent->ops));          // ops reported to the receiver
      EXPECT_EQ(w[5], "1") << "destination bytes differ";  // verified
    }
    receiver->send("POISON_CHECK");
    EXPECT_EQ(receiver->wait_for("POISON").value_or(""), "POISON ok");
    receiver->quit();
  }
}

INSTANTIATE_TEST_SUITE_P(Loopback, TransferTest, ::testing::ValuesIn(kTransports),
                         [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace baton::kv_transfer
