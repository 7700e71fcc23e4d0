// bench/huge_buffer.h — a zeroed buffer backed by transparent huge pages where
// the kernel allows it, the way a serving process should allocate its KV pool:
// attention touches scattered 2-4 KiB tiles, and with 4 KiB pages nearly every
// tile would also be a TLB miss.
#pragma once

#include <sys/mman.h>

#include <cstddef>
#include <cstdint>

namespace baton::bench {

class HugeBuffer {
 public:
  explicit HugeBuffer(size_t bytes) : size_(bytes) {
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    data_ = p == MAP_FAILED ? nullptr : static_cast<uint8_t*>(p);
    if (data_ && use_huge_pages()) madvise(data_, bytes, MADV_HUGEPAGE);
  }
  ~HugeBuffer() {
    if (data_) munmap(data_, size_);
  }
  HugeBuffer(const HugeBuffer&) = delete;
  HugeBuffer& operator=(const HugeBuffer&) = delete;

  uint8_t* data() { return data_; }
  size_t size() const { return size_; }

  // Set from main (--huge_pages=0) to measure the 4 KiB-page case.
  static bool& use_huge_pages() {
    static bool enabled = true;
    return enabled;
  }

 private:
  uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace baton::bench
