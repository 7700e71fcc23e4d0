// bench/normal_fill.h — benchmark data with the magnitudes of real K/V,
// activations and weights.
//
// Random bytes are no stand-in for them: bytes of 0x00-0x3f give BF16 and
// F32 values down to 2^-126, whose products with queries or probabilities
// are subnormal. Intel cores take a microcode assist for every such product,
// so such data measured decode attention ten times slower than normal values
// do on an Intel Xeon (PERFORMANCE.md, "The machine"); the AMD machines had
// measured the same benchmarks on it at their usual speeds.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/dtype.h"

namespace baton::bench {

// Stores n values drawn from a normal distribution of mean 0 and standard
// deviation `stddev`, as dtype, at data. Deterministic in `seed`.
void fill_normal(void* data, DType dtype, size_t n, uint64_t seed, float stddev = 1.0f);

}  // namespace baton::bench
