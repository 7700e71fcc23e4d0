// kernels/cpu/linear.h — dense layers: out = x · Wᵀ (+ bias), embedding rows.
//
// Weights stay in the checkpoint's dtype (memory-mapped, never copied):
//  * small batches (decode) read F16/BF16 rows directly with AVX2/F16C, so
//    half-precision weights move half the bytes of F32;
//  * large batches (prefill) of BF16 weights go through a BF16 GEMM (x
//    rounded to BF16): on AMX tiles where use_amx_bf16() (gemm_bf16_amx.h),
//    else with VDPBF16PS where use_avx512_bf16() (gemm_bf16_avx512.h). On
//    AMX tiles, batches from kAmxMinRows rows on (decode steps of several
//    sequences) take that GEMM too;
//  * other large batches go through single-threaded OpenBLAS sgemm on
//    per-thread slices of W (converted to F32 tile by tile when W is half).
#pragma once

#include <cstdint>
#include <span>

#include "common/dtype.h"
#include "kernels/cpu/thread_pool.h"

namespace baton::kernels::cpu {

// A row-major weight matrix [rows, cols] as Hugging Face stores Linear weights:
// rows = output features, cols = input features.
struct WeightView {
  const void* data = nullptr;
  DType dtype = DType::kF32;
  int64_t rows = 0;
  int64_t cols = 0;
};

// out[m, w.rows] = x[m, w.cols] · wᵀ + bias. bias is F32 [w.rows] or null.
void linear(ThreadPool& pool, const float* x, int64_t m, const WeightView& w, const float* bias,
            float* out);

// One of several projections of the same input: out[m, weight.rows] =
// x · weightᵀ + bias (bias F32 [weight.rows] or null).
struct LinearOutput {
  WeightView weight;
  const float* bias = nullptr;
  float* out = nullptr;
};

// Every output of `outputs` (all with the same weight.cols) from one x, in one
// pass of the pool: a layer's q/k/v or gate/up projections read one input, and
// sharing out their rows as if they were one matrix joins the threads once
// instead of once a weight, and keeps small weights (a 192-row k_proj) from
// being split into pieces too short to stream well.
void linear(ThreadPool& pool, const float* x, int64_t m, std::span<const LinearOutput> outputs);

// Rows of x from which BF16 weights go to the AMX GEMM rather than the
// GEMV where the CPU has AMX tiles. Up to gemv_max_batch() rows the GEMM
// takes x split in three BF16 parts (AmxX::kSplit), so its products are
// the GEMV's; a tile then costs the same for 1 to 16 rows, where the GEMV's
// FMAs grow with them. On an Intel Xeon of the Emerald Rapids generation
// (bench/ab.py, 3-4 rounds), against the GEMV: BF16 weights 4864 x 896 and
// 1536 x 576 took 1.57-1.65 of its time at 4 rows, 0.94-0.97 at 8,
// 0.46-0.52 at 16; whole decode steps (model_bench) of smollm2-135m and
// qwen2.5-0.5b ran at 0.93 and 0.70 of its tokens/s at 8 sequences, 1.32
// and 1.14 at 16, 1.53 and 1.30 at 32.
inline constexpr int64_t kAmxMinRows = 16;

// True when linear() multiplies these weights by x rounded to BF16 at m
// rows (a BF16 GEMM takes it whole), as the tests' references must.
bool linear_rounds_x_to_bf16(int64_t m, DType weights);
// True when linear() runs these weights at m rows on AMX tiles (benchmark labels).
bool linear_takes_amx(int64_t m, DType weights);

// out[n, table.cols] = table[ids[i]] as F32. Ids are validated by the caller.
void embedding(ThreadPool& pool, const WeightView& table, const int32_t* ids, int64_t n,
               float* out);

}  // namespace baton::kernels::cpu
