// bench/amx_ceiling.h — the peak of AMX BF16 tiles, the ceiling the BF16
// prefill GEMM on them (kernels/cpu/gemm_bf16_amx.h) is compared with.
#pragma once

namespace baton::bench {

// TDPBF16PS on tiles already in registers (four independent accumulators,
// nothing loaded or stored in the loop) on every pool thread at once:
// GFLOP/s. 0 where the CPU gives no AMX BF16 (cpu_has_amx_bf16()).
double amx_bf16_pass_gflops();

}  // namespace baton::bench
