#include "engine/ssd_kv_store.h"

#include <fcntl.h>
#include <liburing.h>
#include <spdlog/spdlog.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>
#define XXH_STATIC_LINKING_ONLY  // XXH3_state_t on the stack
#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>

#include "common/check.h"

namespace baton::engine {
namespace {

constexpr uint64_t kHeaderBytes = 4096;
constexpr uint64_t kAlignment = 4096;
constexpr char kMagic[8] = {'B', 'A', 'T', 'O', 'N', 'K', 'V', '1'};
constexpr auto kRingDepth = unsigned(SsdKvStore::kIoDepth);

// The fixed part of a slot's header; the block's tokens follow it.
struct SlotHeader {
  char magic[8];
  int32_t num_layers;
  int32_t block_size;
  int32_t num_kv_heads;
  int32_t head_dim;
  int32_t dtype;
  int32_t reserved;
  uint64_t hash;
  uint64_t parent;
  uint64_t payload_checksum;
  uint64_t header_checksum;  // of everything before it and the tokens after it
};
static_assert(sizeof(SlotHeader) == 64);

uint64_t round_up(uint64_t n, uint64_t to) { return (n + to - 1) / to * to; }

uint64_t header_checksum(const SlotHeader& h, const int32_t* tokens, int32_t block_size) {
  XXH3_state_t state;
  XXH3_64bits_reset(&state);
  XXH3_64bits_update(&state, &h, offsetof(SlotHeader, header_checksum));
  XXH3_64bits_update(&state, tokens, size_t(block_size) * sizeof(int32_t));
  return XXH3_64bits_digest(&state);
}

std::string errno_text(int error) { return std::strerror(error); }

// A new file at `path`, locked (flock, held while the descriptor stays
// open), or -1 if that name is taken. It is made and locked under
// `staging`, then linked to `path` (a link fails rather than replace a
// file): a file under a store's name is never there unlocked, so
// remove_unlocked_files cannot take a new store's file for a dead one's.
Result<int> create_locked(const std::filesystem::path& staging, const std::filesystem::path& path) {
  const int fd = ::open(staging.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0 && errno == EEXIST) return -1;
  if (fd < 0)
    return io_error("ssd cache: cannot create " + staging.string() + ": " + errno_text(errno));
  int error = 0;
  std::string failed;
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    error = errno;
    failed = "cannot lock " + staging.string();
  } else if (::link(staging.c_str(), path.c_str()) != 0) {
    error = errno;
    failed = "cannot link " + staging.string() + " to " + path.string();
  }
  ::unlink(staging.c_str());
  if (failed.empty()) return fd;
  ::close(fd);
  if (error == EEXIST) return -1;
  return io_error("ssd cache: " + failed + ": " + errno_text(error));
}

}  // namespace

struct SsdKvStore::Io {
  int64_t slot = -1;
  uint64_t offset = 0;  // of the slot in the file
  const BlockKey* key = nullptr;
  Status status;  // a read's verification
  std::vector<iovec> iov;
  size_t bytes = 0;
  ssize_t result = 0;    // bytes moved, or -errno
  bool done = false;     // result is in
  bool in_ring = false;  // an asynchronous read the load ring has not completed
  std::unique_ptr<std::byte[]> header{new std::byte[kHeaderBytes]};
};

// io_uring, when the kernel allows it: every I/O of a batch in flight at once.
class SsdKvStore::Ring {
 public:
  // `async`: hand the copies to the kernel's workers (IOSQE_ASYNC) if the
  // kernel takes that flag; `probed`: it is known to, so no need to ask.
  static std::unique_ptr<Ring> create(bool async, bool probed = false) {
    auto ring = std::unique_ptr<Ring>(new Ring);
    const int rc = io_uring_queue_init(kRingDepth, &ring->ring_, 0);
    if (rc < 0) {
      spdlog::info("ssd cache: io_uring unavailable ({}); using preadv/pwritev", errno_text(-rc));
      return nullptr;
    }
    ring->ready_ = true;
    if (async && probed) {
      ring->sqe_flags_ = IOSQE_ASYNC;
    } else if (async) {
      const Result<bool> taken = ring->takes_async_flag();
      if (!taken.is_ok()) {
        spdlog::info("ssd cache: {}; using preadv/pwritev", taken.status().message());
        return nullptr;
      }
      ring->sqe_flags_ = *taken ? IOSQE_ASYNC : 0;
      if (!*taken) spdlog::info("ssd cache: the kernel refuses IOSQE_ASYNC (before Linux 5.6)");
    }
    return ring;
  }
  bool async() const { return sqe_flags_ == IOSQE_ASYNC; }
  ~Ring() {
    if (ready_) io_uring_queue_exit(&ring_);
  }

  // Prepares and submits the I/Os one at a time, each as soon as it is
  // prepared, and completes each as its result arrives: the kernel's workers
  // copy (IOSQE_ASYNC: never inline in this thread) while this thread
  // checksums the next block to write, or verifies a block already read.
  // False if the ring itself failed: the I/Os submitted are completed, the
  // others left not done, and the ring must not be used again.
  bool run(std::span<Io> ios, int fd, bool write, const IoCallback& prepare,
           const IoCallback& complete) {
    size_t next = 0, in_flight = 0;
    bool failed = false;
    auto reap = [&](io_uring_cqe* cqe) {
      Io& io = ios[io_uring_cqe_get_data64(cqe)];
      io.result = cqe->res;
      io_uring_cqe_seen(&ring_, cqe);
      --in_flight;
      io.done = true;
      complete(io);
    };
    while ((!failed && next < ios.size()) || in_flight > 0) {
      io_uring_sqe* sqe = !failed && next < ios.size() ? io_uring_get_sqe(&ring_) : nullptr;
      if (sqe != nullptr) {
        Io& io = ios[next];
        prepare(io);
        if (write) {
          io_uring_prep_writev(sqe, fd, io.iov.data(), unsigned(io.iov.size()), io.offset);
        } else {
          io_uring_prep_readv(sqe, fd, io.iov.data(), unsigned(io.iov.size()), io.offset);
        }
        io_uring_sqe_set_flags(sqe, sqe_flags_);
        io_uring_sqe_set_data64(sqe, next);
        const int rc = io_uring_submit(&ring_);
        if (rc < 1) {
          // Not taken: the ring is in trouble (memory, a full completion
          // queue). Wait for what is in flight, and let the caller finish
          // the rest another way; the queued entry dies with the ring.
          spdlog::warn("ssd cache: io_uring submit failed ({})",
                       rc < 0 ? errno_text(-rc) : "nothing taken");
          failed = true;
        } else {
          ++next;
          ++in_flight;
        }
      } else if (!failed && in_flight == 0) {
        failed = true;  // no entry free with nothing in flight: never expected
      }
      io_uring_cqe* cqe = nullptr;
      while (in_flight > 0 && io_uring_peek_cqe(&ring_, &cqe) == 0) reap(cqe);
      // Wait only when nothing more can be submitted.
      if (in_flight > 0 && (failed || next == ios.size() || sqe == nullptr)) {
        const int rc = io_uring_wait_cqe(&ring_, &cqe);
        if (rc == 0) {
          reap(cqe);
        } else if (rc != -EINTR) {
          spdlog::error("ssd cache: io_uring wait failed ({}); giving up on {} I/Os",
                        errno_text(-rc), in_flight);
          return false;
        }
      }
    }
    return !failed;
  }

  // The asynchronous side (a ring of its own, so the batches of run() never
  // see these completions). Submits one read, its completion to carry `io`;
  // false if the ring would not take it.
  bool submit_read(Io& io, int fd) {
    io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
    if (sqe == nullptr) return false;
    io_uring_prep_readv(sqe, fd, io.iov.data(), unsigned(io.iov.size()), io.offset);
    io_uring_sqe_set_flags(sqe, sqe_flags_);
    io_uring_sqe_set_data(sqe, &io);
    const int rc = io_uring_submit(&ring_);
    if (rc >= 1) return true;
    spdlog::warn("ssd cache: io_uring submit failed ({})",
                 rc < 0 ? errno_text(-rc) : "nothing taken");
    return false;
  }
  // Completes every read that has landed (complete(io) with io.result set);
  // `wait`: waits for one first. False if waiting failed: the ring must not
  // be used again.
  bool reap(bool wait, const IoCallback& complete) {
    io_uring_cqe* cqe = nullptr;
    if (wait) {
      int rc;
      while ((rc = io_uring_wait_cqe(&ring_, &cqe)) == -EINTR) {
      }
      if (rc < 0) {
        spdlog::error("ssd cache: io_uring wait failed ({})", errno_text(-rc));
        return false;
      }
    }
    while (io_uring_peek_cqe(&ring_, &cqe) == 0) {
      Io& io = *static_cast<Io*>(io_uring_cqe_get_data(cqe));
      io.result = cqe->res;
      io_uring_cqe_seen(&ring_, cqe);
      io.done = true;
      complete(io);
    }
    return true;
  }

 private:
  Ring() = default;
  // Kernels before 5.6 fail every entry that carries IOSQE_ASYNC (EINVAL):
  // a no-op with the flag says whether this one takes it.
  Result<bool> takes_async_flag() {
    io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
    if (sqe == nullptr) return internal_error("io_uring has no free entry");
    io_uring_prep_nop(sqe);
    io_uring_sqe_set_flags(sqe, IOSQE_ASYNC);
    int rc = io_uring_submit(&ring_);
    if (rc < 1) return io_error("io_uring submit failed (" + errno_text(-rc) + ")");
    io_uring_cqe* cqe = nullptr;
    while ((rc = io_uring_wait_cqe(&ring_, &cqe)) == -EINTR) {
    }
    if (rc < 0) return io_error("io_uring wait failed (" + errno_text(-rc) + ")");
    const int result = cqe->res;
    io_uring_cqe_seen(&ring_, cqe);
    return result != -EINVAL;
  }

  io_uring ring_{};
  bool ready_ = false;
  unsigned sqe_flags_ = 0;
};

void SsdKvStore::remove_unlocked_files(const std::filesystem::path& dir) {
  // Stepped with error codes: a range-for's increment throws where the
  // directory cannot be read on (EIO), and this cleanup is only a courtesy.
  std::error_code ec;
  for (std::filesystem::directory_iterator it(dir, ec), last; !ec && it != last; it.increment(ec)) {
    const std::filesystem::directory_entry& entry = *it;
    // baton-kv-<pid>-<n>.bin, and nothing else.
    const std::string name = entry.path().filename().string();
    int pid = 0, n = 0, end = 0;
    if (std::sscanf(name.c_str(), "baton-kv-%d-%d.bin%n", &pid, &n, &end) != 2 ||
        size_t(end) != name.size()) {
      continue;
    }
    // A living store holds the lock on its file, whichever PID namespace
    // (or process of this one) it runs in: a pid in the name says nothing
    // across containers sharing the directory. Removed while locked here,
    // and only if the name still is the file locked (another cleaner may
    // have removed it, and a new store taken the name, meanwhile).
    // O_NONBLOCK: a FIFO of that name would block the open for a writer.
    const int fd = ::open(entry.path().c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    if (fd < 0) continue;
    struct stat locked = {};
    struct stat named = {};
    if (::flock(fd, LOCK_EX | LOCK_NB) == 0 && ::fstat(fd, &locked) == 0 &&
        S_ISREG(locked.st_mode) && ::stat(entry.path().c_str(), &named) == 0 &&
        locked.st_ino == named.st_ino && locked.st_dev == named.st_dev) {
      std::error_code removed;
      if (std::filesystem::remove(entry.path(), removed)) {
        spdlog::info("ssd cache: removed {}, left by a process that is gone",
                     entry.path().string());
      }
    }
    ::close(fd);
  }
}

Result<std::unique_ptr<SsdKvStore>> SsdKvStore::create(const std::filesystem::path& dir,
                                                       uint64_t capacity_bytes,
                                                       const KvLayout& layout, SsdIo io) {
  if (layout.block_size > int32_t((kHeaderBytes - sizeof(SlotHeader)) / sizeof(int32_t))) {
    return invalid_argument("ssd cache: blocks of " + std::to_string(layout.block_size) +
                            " tokens do not fit a slot header");
  }
  const uint64_t slot_bytes = slot_bytes_for(layout);
  const auto slots = int64_t(capacity_bytes / slot_bytes);
  if (slots < 1) {
    return invalid_argument("engine.ssd_cache_bytes: " + std::to_string(capacity_bytes) +
                            " bytes hold no slot of " + std::to_string(slot_bytes) +
                            " bytes (one block of every layer and a header)");
  }
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec)) {
    return not_found("engine.ssd_cache_dir: " + dir.string() + " is not a directory");
  }
  remove_unlocked_files(dir);
  static std::atomic<int> counter{0};
  for (int attempt = 0; attempt < 100; ++attempt) {
    const std::string stem = std::to_string(::getpid()) + "-" + std::to_string(counter++);
    std::filesystem::path path = dir / ("baton-kv-" + stem + ".bin");
    Result<int> fd = create_locked(dir / (".baton-kv-" + stem + ".new"), path);
    if (!fd.is_ok()) return fd.status();
    if (*fd < 0) continue;  // the name is taken (another PID namespace, or an earlier process)
    return std::unique_ptr<SsdKvStore>(new SsdKvStore(std::move(path), *fd, layout, slots, io));
  }
  return io_error("ssd cache: no free file name in " + dir.string());
}

uint64_t SsdKvStore::slot_bytes_for(const KvLayout& layout) {
  return kHeaderBytes + round_up(uint64_t(layout.num_layers) * layout.block_bytes(), kAlignment);
}

SsdKvStore::SsdKvStore(std::filesystem::path path, int fd, const KvLayout& layout, int64_t slots,
                       SsdIo io)
    : path_(std::move(path)),
      fd_(fd),
      layout_(layout),
      slot_bytes_(slot_bytes_for(layout)),
      capacity_(slots),
      ring_(io != SsdIo::kPlain ? Ring::create(io == SsdIo::kIoUring) : nullptr),
      load_ring_(ring_ ? Ring::create(ring_->async(), /*probed=*/true) : nullptr) {
  stats_.capacity_blocks = slots;
  spdlog::info("ssd cache: {} ({} slots of {} KiB, {})", path_.string(), slots, slot_bytes_ >> 10,
               !ring_           ? "preadv/pwritev"
               : ring_->async() ? "io_uring"
                                : "io_uring, inline");
}

SsdKvStore::~SsdKvStore() {
  // The kernel may still be writing pool blocks of loads in flight.
  while (!loads_.empty()) finish_loads(/*wait=*/true);
  load_ring_.reset();
  ring_.reset();
  // Removed while still locked: a cleaner finds it either locked or gone.
  std::error_code ec;
  std::filesystem::remove(path_, ec);
  fd_.reset();
}

bool SsdKvStore::hands_copies_to_kernel_workers() const { return ring_ && ring_->async(); }

SsdKvStoreStats SsdKvStore::stats() const {
  SsdKvStoreStats s = stats_;
  s.stored_blocks = int64_t(by_hash_.size());
  return s;
}

int64_t SsdKvStore::find(const BlockKey& key) const {
  const auto it = by_hash_.find(key.hash);
  if (it == by_hash_.end()) return -1;
  const Slot& s = slots_[size_t(it->second)];
  if (s.parent != key.parent || !std::ranges::equal(s.tokens, key.tokens)) return -1;
  return it->second;
}

bool SsdKvStore::contains(const BlockKey& key) const { return find(key) >= 0; }

void SsdKvStore::touch(std::span<const BlockKey> keys) {
  for (const BlockKey& key : keys) {
    if (const int64_t slot = find(key); slot >= 0) touch(slot);
  }
}

int64_t SsdKvStore::take_slot() {
  if (!free_slots_.empty()) {
    const int64_t slot = free_slots_.back();
    free_slots_.pop_back();
    return slot;
  }
  if (int64_t(slots_.size()) < capacity_) {
    slots_.emplace_back();
    return int64_t(slots_.size()) - 1;
  }
  // The least recently used slot no asynchronous load is reading.
  const auto it =
      std::ranges::find_if(recency_, [&](int64_t slot) { return slots_[size_t(slot)].pins == 0; });
  if (it == recency_.end()) return -1;
  const int64_t slot = *it;
  recency_.erase(it);
  Slot& s = slots_[size_t(slot)];
  by_hash_.erase(s.hash);
  s.tokens.clear();
  return slot;
}

void SsdKvStore::drop(int64_t slot) {
  Slot& s = slots_[size_t(slot)];
  if (s.tokens.empty()) return;
  by_hash_.erase(s.hash);
  recency_.erase(s.recency);
  s.tokens.clear();
  // One still being read or written goes free with its last pin.
  if (s.pins == 0) free_slots_.push_back(slot);
  ++stats_.dropped_blocks;
}

void SsdKvStore::unpin_slot(int64_t slot) {
  Slot& s = slots_[size_t(slot)];
  BATON_CHECK(s.pins > 0);
  if (--s.pins == 0 && s.tokens.empty()) free_slots_.push_back(slot);  // dropped meanwhile
}

std::vector<int64_t> SsdKvStore::pin(std::span<const BlockKey> keys) {
  std::vector<int64_t> pinned;
  for (const BlockKey& key : keys) {
    if (const int64_t slot = find(key); slot >= 0) {
      ++slots_[size_t(slot)].pins;
      pinned.push_back(slot);
    }
  }
  return pinned;
}

void SsdKvStore::unpin(std::span<const int64_t> slots) {
  for (const int64_t slot : slots) unpin_slot(slot);
}

void SsdKvStore::touch(int64_t slot) {
  Slot& s = slots_[size_t(slot)];
  recency_.splice(recency_.end(), recency_, s.recency);
}

BlockMemory BlockMemory::of_pool(const KvLayout& layout, const void* pool) {
  return BlockMemory{.base = static_cast<std::byte*>(const_cast<void*>(pool)),
                     .layer_stride = layout.layer_elements() * layout.element_bytes(),
                     .block_stride = layout.block_bytes()};
}

void SsdKvStore::describe(Io& io, int64_t slot, const BlockMemory& memory, int32_t block,
                          void* header) const {
  io.slot = slot;
  io.offset = uint64_t(slot) * slot_bytes_;
  io.iov.clear();
  io.iov.push_back({header, kHeaderBytes});
  const size_t block_bytes = layout_.block_bytes();
  for (int32_t layer = 0; layer < layout_.num_layers; ++layer)
    io.iov.push_back({memory.at(layer, block), block_bytes});
  io.bytes = kHeaderBytes + size_t(layout_.num_layers) * block_bytes;
  io.result = 0;
  io.done = false;
}

void SsdKvStore::run(std::span<Io> ios, bool write, const IoCallback& prepare,
                     const IoCallback& complete) {
  if (ring_) {
    if (ring_->run(ios, fd_.get(), write, prepare, complete)) return;
    spdlog::warn("ssd cache: {}: using preadv/pwritev from now on", path_.string());
    ring_.reset();
  }
  for (Io& io : ios) {
    if (io.done) continue;
    prepare(io);
    const auto offset = off_t(io.offset);
    const ssize_t n = write ? ::pwritev(fd_.get(), io.iov.data(), int(io.iov.size()), offset)
                            : ::preadv(fd_.get(), io.iov.data(), int(io.iov.size()), offset);
    io.result = n < 0 ? -errno : n;
    io.done = true;
    complete(io);
  }
}

namespace {

uint64_t payload_checksum(const std::vector<iovec>& iov) {
  XXH3_state_t state;
  XXH3_64bits_reset(&state);
  for (size_t i = 1; i < iov.size(); ++i)
    XXH3_64bits_update(&state, iov[i].iov_base, iov[i].iov_len);
  return XXH3_64bits_digest(&state);
}

}  // namespace

void SsdKvStore::write_header(Io& io) const {
  const BlockKey& key = *io.key;
  std::memset(io.header.get(), 0, kHeaderBytes);
  SlotHeader h{};
  std::memcpy(h.magic, kMagic, sizeof(kMagic));
  h.num_layers = layout_.num_layers;
  h.block_size = layout_.block_size;
  h.num_kv_heads = layout_.num_kv_heads;
  h.head_dim = layout_.head_dim;
  h.dtype = int32_t(layout_.dtype);
  h.hash = key.hash;
  h.parent = key.parent;
  h.payload_checksum = payload_checksum(io.iov);
  h.header_checksum = header_checksum(h, key.tokens.data(), layout_.block_size);
  std::memcpy(io.header.get(), &h, sizeof(h));
  std::memcpy(io.header.get() + sizeof(h), key.tokens.data(), key.tokens.size_bytes());
}

void SsdKvStore::save(std::span<const BlockKey> keys, const BlockMemory& memory,
                      std::span<const int32_t> blocks) {
  BATON_CHECK(keys.size() == blocks.size());
  // The slots a batch takes are pinned until it is written, so that a later
  // write of the same batch never takes one of them again (with most slots
  // pinned by loads, the least recently used unpinned one could be).
  const size_t batch = std::min<size_t>(size_t(capacity_), kRingDepth);
  std::vector<Io> ios;
  for (size_t begin = 0; begin < keys.size(); begin += batch) {
    ios.clear();
    const size_t end = std::min(keys.size(), begin + batch);
    for (size_t i = begin; i < end; ++i) {
      const BlockKey& key = keys[i];
      BATON_CHECK(int32_t(key.tokens.size()) == layout_.block_size);
      if (const int64_t stored = find(key); stored >= 0) {
        touch(stored);
        continue;
      }
      // Another key of the same hash (a 64-bit collision) keeps its slot:
      // dropping it here could hand its slot, still being written in this
      // batch, to this key.
      if (by_hash_.contains(key.hash)) continue;
      const int64_t slot = take_slot();
      if (slot < 0) continue;  // every slot is being read: not saved
      Slot& s = slots_[size_t(slot)];
      s.hash = key.hash;
      s.parent = key.parent;
      s.tokens.assign(key.tokens.begin(), key.tokens.end());
      s.recency = recency_.insert(recency_.end(), slot);
      by_hash_[key.hash] = slot;
      ++s.pins;

      Io& io = ios.emplace_back();
      describe(io, slot, memory, blocks[i], io.header.get());
      io.key = &key;
    }
    // The header, with the payload's checksum, as each write is submitted.
    run(
        ios, /*write=*/true, [this](Io& io) { write_header(io); }, [](Io&) {});
    for (const Io& io : ios) {
      unpin_slot(io.slot);
      if (io.result == ssize_t(io.bytes)) {
        ++stats_.saved_blocks;
        continue;
      }
      // A full disk fails every write: say so at the 1st, 2nd, 4th, ...
      const int64_t failed = ++stats_.failed_writes;
      if ((failed & (failed - 1)) == 0) {
        spdlog::warn(
            "ssd cache: {}: slot {}: {} ({} failed writes so far; their blocks are dropped)",
            path_.string(), io.slot,
            io.result < 0 ? "write failed: " + errno_text(int(-io.result))
                          : "short write (" + std::to_string(io.result) + " of " +
                                std::to_string(io.bytes) + " bytes)",
            failed);
      }
      drop(io.slot);
    }
  }
}

Status SsdKvStore::verify(const Io& io, int64_t slot, const BlockKey& key) const {
  auto fail = [&](StatusCode code, const std::string& what) {
    return Status(code, path_.string() + ": slot " + std::to_string(slot) + ": " + what);
  };
  if (io.result < 0)
    return fail(StatusCode::kIoError, "read failed: " + errno_text(int(-io.result)));
  if (io.result != ssize_t(io.bytes)) {
    return fail(StatusCode::kDataLoss, "short read (" + std::to_string(io.result) + " of " +
                                           std::to_string(io.bytes) + " bytes)");
  }
  SlotHeader h;
  std::memcpy(&h, io.header.get(), sizeof(h));
  const auto* tokens = reinterpret_cast<const int32_t*>(io.header.get() + sizeof(h));
  if (std::memcmp(h.magic, kMagic, sizeof(kMagic)) != 0)
    return fail(StatusCode::kDataLoss, "not a Baton KV slot (bad magic)");
  if (h.header_checksum != header_checksum(h, tokens, layout_.block_size))
    return fail(StatusCode::kDataLoss, "header checksum mismatch");
  if (h.num_layers != layout_.num_layers || h.block_size != layout_.block_size ||
      h.num_kv_heads != layout_.num_kv_heads || h.head_dim != layout_.head_dim ||
      h.dtype != int32_t(layout_.dtype)) {
    return fail(StatusCode::kDataLoss, "block geometry differs from the pool's");
  }
  if (h.hash != key.hash || h.parent != key.parent ||
      !std::equal(key.tokens.begin(), key.tokens.end(), tokens)) {
    return fail(StatusCode::kDataLoss, "holds another block's key");
  }
  const uint64_t read = payload_checksum(io.iov);
  if (read != h.payload_checksum) {
    char text[96];
    std::snprintf(text, sizeof(text), "payload checksum mismatch (stored %016llx, read %016llx)",
                  static_cast<unsigned long long>(h.payload_checksum),
                  static_cast<unsigned long long>(read));
    return fail(StatusCode::kDataLoss, text);
  }
  return Status::ok();
}

SsdLoad SsdKvStore::account(std::span<Io> ios) {
  SsdLoad out;
  for (Io& io : ios) {
    if (!io.status.is_ok()) {
      // A damaged slot goes, and so does one the OS failed to read: a bad
      // sector fails every read, and the block is only recomputed.
      drop(io.slot);
      out.problem = std::move(io.status);
      return out;
    }
    touch(io.slot);
    ++stats_.loaded_blocks;
    ++out.restored;
  }
  return out;
}

SsdLoad SsdKvStore::load(std::span<const BlockKey> keys, const BlockMemory& memory,
                         std::span<const int32_t> blocks) {
  BATON_CHECK(keys.size() == blocks.size());
  SsdLoad out;
  std::vector<Io> ios;
  for (size_t begin = 0; begin < keys.size(); begin += kRingDepth) {
    ios.clear();
    const size_t end = std::min(keys.size(), begin + kRingDepth);
    for (size_t i = begin; i < end; ++i) {
      const int64_t slot = find(keys[i]);
      if (slot < 0) break;
      Io& io = ios.emplace_back();
      describe(io, slot, memory, blocks[i], io.header.get());
      io.key = &keys[i];
    }
    // Each block verified as it arrives, while later ones are read.
    run(
        ios, /*write=*/false, [](Io&) {},
        [this](Io& io) { io.status = verify(io, io.slot, *io.key); });
    const SsdLoad batch = account(ios);
    out.restored += batch.restored;
    if (!batch.problem.is_ok()) {
      out.problem = batch.problem;
      return out;
    }
    if (ios.size() < end - begin) return out;  // the next key is not stored
  }
  return out;
}

// An asynchronous load: its own copy of the keys, and one read per leading
// stored key, submitted as the load ring has room.
struct SsdKvStore::PendingLoad {
  int64_t id = 0;
  std::vector<int32_t> tokens;  // the keys' tokens
  std::vector<BlockKey> keys;   // their spans point into tokens
  std::vector<Io> ios;
  size_t submitted = 0;  // ios before this one went to the ring or were read
  bool landed() const {
    return std::ranges::all_of(ios, [](const Io& io) { return io.done; });
  }
};

int64_t SsdKvStore::start_load(std::span<const BlockKey> keys, const BlockMemory& memory,
                               std::span<const int32_t> blocks) {
  BATON_CHECK(keys.size() == blocks.size());
  PendingLoad& load = loads_.emplace_back();
  load.id = next_load_id_++;
  for (const BlockKey& key : keys)
    load.tokens.insert(load.tokens.end(), key.tokens.begin(), key.tokens.end());
  size_t at = 0;
  for (const BlockKey& key : keys) {
    load.keys.push_back(
        BlockKey{.hash = key.hash,
                 .parent = key.parent,
                 .tokens = std::span<const int32_t>(load.tokens).subspan(at, key.tokens.size())});
    at += key.tokens.size();
  }
  load.ios.reserve(keys.size());  // their addresses travel with the reads
  for (size_t i = 0; i < keys.size(); ++i) {
    const int64_t slot = find(keys[i]);
    if (slot < 0) break;
    Io& io = load.ios.emplace_back();
    describe(io, slot, memory, blocks[i], io.header.get());
    io.key = &load.keys[i];
    ++slots_[size_t(slot)].pins;
  }
  if (load_ring_) {
    submit_loads();
  } else {
    read_loads_directly();
  }
  return load.id;
}

void SsdKvStore::submit_loads() {
  for (PendingLoad& load : loads_) {
    for (; load.submitted < load.ios.size(); ++load.submitted) {
      if (loads_submitted_ >= int32_t(kRingDepth)) return;
      Io& io = load.ios[load.submitted];
      if (!load_ring_->submit_read(io, fd_.get())) {
        give_up_load_ring("a submit failed");
        return;
      }
      io.in_ring = true;
      ++loads_submitted_;
    }
  }
}

void SsdKvStore::read_loads_directly() {
  for (PendingLoad& load : loads_) {
    for (Io& io : load.ios) {
      if (io.done || io.in_ring) continue;
      const ssize_t n = ::preadv(fd_.get(), io.iov.data(), int(io.iov.size()), off_t(io.offset));
      io.result = n < 0 ? -errno : n;
      io.done = true;
      io.status = verify(io, io.slot, *io.key);
    }
    load.submitted = load.ios.size();
  }
}

void SsdKvStore::complete_ring_load(Io& io) {
  io.in_ring = false;
  io.status = verify(io, io.slot, *io.key);
  --loads_submitted_;
}

void SsdKvStore::give_up_load_ring(const char* why) {
  spdlog::warn("ssd cache: {}: io_uring {}: using preadv for loads from now on", path_.string(),
               why);
  const IoCallback complete = [this](Io& io) { complete_ring_load(io); };
  bool ok = true;
  while (ok && loads_submitted_ > 0) ok = load_ring_->reap(/*wait=*/true, complete);
  if (!ok) {
    // Not expected (the kernel dropped completions): the ring can no longer
    // say when its reads land. They are read again below, and any that
    // lands later writes the same bytes, unless the block was reused by
    // then; logged as an error for that reason.
    spdlog::error("ssd cache: {}: {} reads left in flight in a failed io_uring", path_.string(),
                  loads_submitted_);
  }
  load_ring_.reset();
  loads_submitted_ = 0;
  for (PendingLoad& load : loads_) {
    for (Io& io : load.ios) io.in_ring = false;
  }
  read_loads_directly();
}

std::vector<SsdKvStore::LandedLoad> SsdKvStore::finish_loads(bool wait) {
  auto landed_any = [&] { return std::ranges::any_of(loads_, &PendingLoad::landed); };
  if (load_ring_ && loads_submitted_ > 0) {
    const IoCallback complete = [this](Io& io) { complete_ring_load(io); };
    bool ok = load_ring_->reap(/*wait=*/false, complete);
    if (ok) submit_loads();
    while (ok && load_ring_ && wait && loads_submitted_ > 0 && !landed_any()) {
      ok = load_ring_->reap(/*wait=*/true, complete);
      if (ok) submit_loads();
    }
    if (!ok && load_ring_) give_up_load_ring("a wait failed");
  }
  std::vector<LandedLoad> out;
  for (auto it = loads_.begin(); it != loads_.end();) {
    if (!it->landed()) {
      ++it;
      continue;
    }
    for (const Io& io : it->ios) unpin_slot(io.slot);
    out.push_back(LandedLoad{.id = it->id, .result = account(it->ios)});
    it = loads_.erase(it);
  }
  return out;
}

}  // namespace baton::engine
