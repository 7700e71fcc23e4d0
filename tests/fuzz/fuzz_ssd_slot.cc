// libFuzzer target: a slot of the SSD tier's file overwritten with arbitrary
// bytes (at an offset the input picks) between a save and a load, as a
// failing disk or another process might. A load either restores exactly the
// bytes that were saved or refuses the slot with a DataLoss naming the file;
// nothing crashes, and a refused slot is dropped (the next save writes it
// again).
#include <fcntl.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <vector>

#include "engine/ssd_kv_store.h"

namespace {

using namespace baton;

struct Fixture {
  KvLayout layout;
  std::vector<uint8_t> saved;   // pool of two blocks: block 0 is saved, block 1 loaded into
  std::vector<int32_t> tokens;  // the key's
  engine::BlockKey key{};
  std::filesystem::path dir;
  std::unique_ptr<engine::SsdKvStore> store;
  int fd = -1;  // the store's file, to damage it

  Fixture() {
    layout.num_layers = 2;
    layout.num_blocks = 2;
    layout.block_size = 4;
    layout.num_kv_heads = 1;
    layout.head_dim = 8;
    layout.dtype = DType::kF32;
    saved.resize(layout.total_bytes());
    for (size_t i = 0; i < saved.size(); ++i) saved[i] = uint8_t(i * 131 + 7);
    tokens = {11, 12, 13, 14};
    key = {0x1234, 0x99, tokens};
    dir = std::filesystem::temp_directory_path() / ("baton-fuzz-ssd-" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir);
    auto made = engine::SsdKvStore::create(dir, engine::SsdKvStore::slot_bytes_for(layout), layout,
                                           engine::SsdIo::kPlain);
    if (!made.is_ok()) std::abort();
    store = std::move(made).value();
    fd = ::open(store->path().c_str(), O_WRONLY | O_CLOEXEC);
    if (fd < 0) std::abort();
  }
};

bool block_equals_saved(const Fixture& f, const std::vector<uint8_t>& pool) {
  for (int32_t layer = 0; layer < f.layout.num_layers; ++layer) {
    const size_t loaded = f.layout.block_byte_offset(layer, 1);
    const size_t original = f.layout.block_byte_offset(layer, 0);
    if (std::memcmp(pool.data() + loaded, f.saved.data() + original, f.layout.block_bytes()) != 0)
      return false;
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static Fixture f;
  if (size < 4) return 0;
  const int32_t block0 = 0, block1 = 1;
  f.store->save({&f.key, 1}, f.saved.data(), {&block0, 1});
  if (!f.store->contains(f.key)) std::abort();
  uint32_t offset = 0;
  std::memcpy(&offset, data, 4);
  offset %= uint32_t(f.store->slot_bytes());
  const size_t length = std::min<size_t>(size - 4, f.store->slot_bytes() - offset);
  if (::pwrite(f.fd, data + 4, length, off_t(offset)) != ssize_t(length)) std::abort();

  std::vector<uint8_t> pool(f.saved);
  std::memset(pool.data() + f.layout.block_byte_offset(0, 1), 0, f.layout.block_bytes());
  std::memset(pool.data() + f.layout.block_byte_offset(1, 1), 0, f.layout.block_bytes());
  const engine::SsdLoad load = f.store->load({&f.key, 1}, pool.data(), {&block1, 1});
  if (load.restored == 1) {
    if (!block_equals_saved(f, pool)) std::abort();  // damaged bytes passed verification
  } else {
    if (load.problem.code() != StatusCode::kDataLoss) std::abort();
    if (load.problem.message().find(f.store->path().string()) == std::string::npos) std::abort();
    if (f.store->contains(f.key)) std::abort();  // a damaged slot is dropped
  }
  return 0;
}
