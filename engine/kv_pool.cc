#include "engine/kv_pool.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>

namespace baton::engine {
namespace {

// Blocks of one request sit anywhere in the pool; huge pages keep attention's
// scattered block reads from missing the TLB. Only advice: ignored where
// refused (an adopted, shared pool may not be page-aligned or eligible).
void advise_huge_pages(void* data, size_t bytes) {
  const auto page = uintptr_t(sysconf(_SC_PAGESIZE));
  const uintptr_t begin = (uintptr_t(data) + page - 1) / page * page;
  const uintptr_t end = uintptr_t(data) + bytes;
  if (end > begin) (void)madvise(reinterpret_cast<void*>(begin), end - begin, MADV_HUGEPAGE);
}

}  // namespace

Result<KvPool> KvPool::create(const KvLayout& layout) {
  if (layout.num_layers <= 0 || layout.num_blocks <= 0 || layout.block_size <= 0 ||
      layout.num_kv_heads <= 0 || layout.head_dim <= 0) {
    return invalid_argument("KV pool layout has a non-positive dimension");
  }
  if (layout.head_dim % layout.key_group() != 0) {
    return invalid_argument("KV pool head_dim " + std::to_string(layout.head_dim) +
                            " is not a multiple of the " + std::to_string(layout.key_group()) +
                            " elements of a key grouped in " +
                            std::string(dtype_name(layout.dtype)));
  }
  size_t bytes = layout.total_bytes();
  // Anonymous mappings are page-aligned and zero-filled lazily, so a large
  // pool costs nothing until its blocks are touched.
  void* data = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (data == MAP_FAILED) {
    return resource_exhausted("cannot map a KV pool of " + std::to_string(bytes) +
                              " bytes: " + std::strerror(errno));
  }
  advise_huge_pages(data, bytes);
  return KvPool(layout, data, bytes, /*owned=*/true);
}

KvPool KvPool::adopt(const KvLayout& layout, void* data) {
  advise_huge_pages(data, layout.total_bytes());
  return KvPool(layout, data, layout.total_bytes(), /*owned=*/false);
}

KvPool KvPool::adopt_device(const KvLayout& layout, void* data,
                            std::function<void(void*)> release) {
  KvPool pool(layout, data, layout.total_bytes(), /*owned=*/false);
  pool.release_device_ = std::move(release);
  return pool;
}

KvPool::KvPool(KvPool&& other) noexcept
    : layout_(other.layout_),
      data_(std::exchange(other.data_, nullptr)),
      bytes_(std::exchange(other.bytes_, 0)),
      owned_(other.owned_),
      release_device_(std::move(other.release_device_)) {}

KvPool& KvPool::operator=(KvPool&& other) noexcept {
  if (this != &other) {
    release();
    layout_ = other.layout_;
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
    owned_ = other.owned_;
    release_device_ = std::move(other.release_device_);
  }
  return *this;
}

KvPool::~KvPool() { release(); }

void KvPool::release() {
  if (data_ != nullptr && owned_) munmap(data_, bytes_);
  if (data_ != nullptr && release_device_) release_device_(data_);
  data_ = nullptr;
  bytes_ = 0;
}

int64_t kv_blocks_for_bytes(const KvLayout& geometry, uint64_t budget_bytes) {
  KvLayout one = geometry;
  one.num_blocks = 1;
  uint64_t per_block_all_layers = uint64_t(one.total_bytes());
  return per_block_all_layers == 0 ? 0 : int64_t(budget_bytes / per_block_all_layers);
}

}  // namespace baton::engine
