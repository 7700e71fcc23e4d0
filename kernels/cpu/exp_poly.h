// kernels/cpu/exp_poly.h — the constants of the vector exp (after Cephes'
// expf) that the AVX2 and AVX-512 kernels share: exp(x) = 2^n exp(r) with
// n = round(x log2 e) and r = x - n ln 2, and exp(r) ≈ 1 + r + r² P(r).
// Relative error about 2e-7 over the float range.
#pragma once

namespace baton::kernels::cpu::exp_poly {

// Inputs are clamped to [kMinInput, kMaxInput]: below, 2^n leaves the
// normal range.
inline constexpr float kMaxInput = 88.3762626647949f;
inline constexpr float kMinInput = -87.0f;
inline constexpr float kLog2e = 1.44269504088896341f;
// ln 2 as a part exact in a few bits plus the rest, so r = x - n ln 2 loses
// nothing to cancellation.
inline constexpr float kLn2Hi = 0.693359375f;
inline constexpr float kLn2Lo = -2.12194440e-4f;
// P's coefficients, highest degree first (Horner's order).
inline constexpr float kP[] = {1.9875691500E-4f, 1.3981999507E-3f, 8.3334519073E-3f,
                               4.1665795894E-2f, 1.6666665459E-1f, 5.0000001201E-1f};

}  // namespace baton::kernels::cpu::exp_poly
