// kernels/cpu/amx_tiles.h — the AMX tile configuration the BF16 GEMM
// (gemm_bf16_amx.h), prefill attention (attention_amx.h) and the GEMM's
// benchmark ceiling use: eight tiles of 16 rows
// by 64 bytes. Only after cpu_has_amx_bf16() said yes.
#pragma once

#include <cstdint>

namespace baton::kernels::cpu {

#if defined(__x86_64__)

// Functions that use the tiles (and AVX-512 BF16 beside them).
#define BATON_AMX                                                               \
  __attribute__((                                                               \
      target("amx-tile,amx-bf16,avx512f,avx512bw,avx512vl,avx512bf16,avx2,fma," \
             "f16c")))
#define BATON_AMX_INLINE                                                                   \
  __attribute__((target("amx-tile,amx-bf16,avx512f,avx512bw,avx512vl,avx512bf16,avx2,fma," \
                        "f16c"),                                                           \
                 always_inline)) inline

inline constexpr int kAmxTiles = 8;
inline constexpr int64_t kAmxTileRows = 16;
inline constexpr int64_t kAmxTileRowBytes = 64;

// The palette-1 layout LDTILECFG reads (Intel SDM).
struct alignas(64) AmxTileConfig {
  uint8_t palette_id = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};
static_assert(sizeof(AmxTileConfig) == 64);

// Configures the calling thread's tiles 0-7 as 16 x 64 bytes. The asm names
// the whole configuration as its input: the compiler's _tile_loadconfig
// names only its first 8 bytes, so the stores of the rest may be dropped
// as dead, and LDTILECFG then faults on what the stack held.
inline void configure_amx_tiles() {
  AmxTileConfig config;
  for (int t = 0; t < kAmxTiles; ++t) {
    config.colsb[t] = uint16_t(kAmxTileRowBytes);
    config.rows[t] = uint8_t(kAmxTileRows);
  }
  asm volatile("ldtilecfg %0" ::"m"(config));
}

// Gives the tile state back (the kernel then need not save it on a switch).
inline void release_amx_tiles() { asm volatile("tilerelease" ::); }

#endif

}  // namespace baton::kernels::cpu
