// tests/engine/reference_model.h — a plain forward pass for testing the engine.
//
// Written independently of kernels/ and engine/model.cc: double accumulation,
// contiguous K/V per sequence, the textbook formulas of Hugging Face's Llama
// (rotate_half RoPE, GQA by h / group). Slow by design; tiny models only.
#pragma once

#include <cstdint>
#include <vector>

#include "common/dtype.h"
#include "engine/checkpoint.h"

namespace baton::engine::testing {

// Logits [tokens.size(), vocab] for every position of one sequence. K (after
// RoPE) and V are rounded to `kv_dtype` before attention, as a KV cache of that
// type stores them. The inputs of the layers' projections (q/k/v, o,
// gate/up, down; not the LM head) are rounded to `projection_input_dtype`,
// as a GEMM that multiplies in that dtype sees them.
std::vector<std::vector<double>> reference_logits(const Checkpoint& checkpoint,
                                                  const std::vector<int32_t>& tokens,
                                                  DType kv_dtype = DType::kF32,
                                                  DType projection_input_dtype = DType::kF32);

// log_softmax of one row, in double.
std::vector<double> log_softmax(const std::vector<double>& logits);

}  // namespace baton::engine::testing
