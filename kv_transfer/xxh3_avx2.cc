// kv_transfer/xxh3_avx2.cc — xxhash's own XXH3-64, compiled for AVX2.
//
// Debian's libxxhash is built for baseline x86-64 (SSE2) and hashes at about
// 8 GB/s from cache here; the same code compiled with AVX2 runs at 25-30 GB/s,
// which is what keeps the transfer checksum from costing a third of the
// transfer. This file is compiled with -mavx2 and called only after a run-time
// check (block_runs.cc), so it must not include anything with external inline
// definitions (the C++ standard library): XXH_INLINE_ALL keeps every xxhash
// symbol static to this file.
#define XXH_INLINE_ALL
#include <xxhash.h>

#if !defined(__AVX2__)
#error "xxh3_avx2.cc must be compiled with -mavx2"
#endif

namespace baton::kv_transfer {

unsigned long long xxh3_64_avx2(const void* data, unsigned long bytes) {
  return XXH3_64bits(data, bytes);
}

}  // namespace baton::kv_transfer
