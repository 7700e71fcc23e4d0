// kernels/cpu/linear.h — dense layers: out = x · Wᵀ (+ bias), embedding rows.
//
// Weights stay in the checkpoint's dtype (memory-mapped, never copied):
//  * small batches (decode) read F16/BF16 rows directly with AVX2/F16C, so
//    half-precision weights move half the bytes of F32;
//  * large batches (prefill) of BF16 weights, where use_avx512_bf16(), go
//    through the BF16 GEMM (gemm_bf16_avx512.h: x rounded to BF16);
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

// out[n, table.cols] = table[ids[i]] as F32. Ids are validated by the caller.
void embedding(ThreadPool& pool, const WeightView& table, const int32_t* ids, int64_t n,
               float* out);

}  // namespace baton::kernels::cpu
