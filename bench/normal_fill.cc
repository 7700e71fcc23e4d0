#include "bench/normal_fill.h"

#include <array>
#include <cstring>
#include <random>

namespace baton::bench {

void fill_normal(void* data, DType dtype, size_t n, uint64_t seed, float stddev) {
  // Drawing each of hundreds of millions of values costs seconds per
  // benchmark case: values are picked at random from a bank of normal draws
  // instead, five 12-bit picks per 64 random bits.
  constexpr size_t kBankBits = 12, kBank = size_t(1) << kBankBits;
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, stddev);
  std::array<float, kBank> bank;
  for (float& x : bank) x = normal(rng);
  auto* out = static_cast<uint8_t*>(data);
  for (size_t i = 0; i < n;) {
    uint64_t bits = rng();
    for (int pick = 0; pick < 5 && i < n; ++pick, ++i, bits >>= kBankBits)
      store_from_float(out, dtype, i, bank[bits & (kBank - 1)]);
  }
}

}  // namespace baton::bench
