// kernels/cpu/cpu_features.h — run-time choice between the AVX-512 and AVX2
// kernels and their portable scalar twins.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

namespace baton::kernels::cpu {

// Bytes per cache line on x86-64 cores: the step of software prefetch loops.
inline constexpr size_t kCacheLine = 64;

// BATON_MAX_CPU_ISA caps the kernels below what the CPU has, as oneDNN's
// ONEDNN_MAX_CPU_ISA does, so that one machine runs what a lesser one would
// (comparisons against peers built for AVX2, or without AMX): "amx" (or
// unset) every path the CPU has, "avx512" no AMX tiles, "avx2" no AVX-512
// path, "scalar" the portable loops only. It is read once, when the process
// starts.
enum class MaxCpuIsa { kScalar, kAvx2, kAvx512, kAmx };
// nullopt for a value other than those four (case-sensitive).
std::optional<MaxCpuIsa> parse_max_cpu_isa(std::string_view value);
// The cap in force; an unset or unknown variable caps nothing.
MaxCpuIsa max_cpu_isa();
// Empty, or why BATON_MAX_CPU_ISA was not understood: `baton` refuses to
// start on it rather than run uncapped (benchmarks run uncapped).
std::string max_cpu_isa_error();

// The widest kernels in use now: "avx512 with bf16 dot products",
// "avx512", "avx2" or "scalar", followed by " and amx bf16 tiles" where
// those run (for logs).
std::string kernel_isa_name();

// True when the CPU has AVX2, FMA and F16C (checked once).
bool cpu_has_avx2_fma_f16c();

// True when the AVX2 paths are to be used: the CPU has them and they were not
// switched off with set_simd_enabled(false) (tests use that to cover the
// scalar fallback on AVX2 machines).
bool use_avx2();
void set_simd_enabled(bool enabled);

// True when the CPU has AVX-512 F, BW and VL (checked once): the 512-bit
// F32 FMA kernels of decode attention (decode_tiles_avx512.h) and of the
// batched GEMV (gemv_avx512.h).
bool cpu_has_avx512();

// True when the AVX-512 paths are to be used: the CPU has them, SIMD is
// enabled and they were not switched off with set_avx512_enabled(false)
// (tests use that to cover the AVX2 paths on AVX-512 machines, benchmarks
// to compare the two).
bool use_avx512();
void set_avx512_enabled(bool enabled);

// False hides every AVX-512 extension past F, BW and VL (BF16, VNNI, VBMI,
// AMX) from the use_ functions below, as on a Skylake-X: tests cover the
// paths such a CPU takes on machines that have more.
void set_avx512_extensions_enabled(bool enabled);

// True when the CPU has AVX-512 F, BW, VL and BF16 (checked once): the BF16
// dot product (VDPBF16PS) of BF16 decode attention's V pass
// (attention_decode_avx512.h) and of the prefill GEMM for BF16 weights
// (gemm_bf16_avx512.h).
bool cpu_has_avx512_bf16();

// True when BF16 decode attention's V pass and the BF16 weights' prefill
// GEMM are to take VDPBF16PS: the CPU has it, use_avx512(), and it is
// preferred. By default it is preferred on AMD (Zen 4 issues more of them
// per second than 512-bit FMAs) and not on Intel (a Xeon of the Emerald
// Rapids generation issues a quarter as many), where the F32 FMA pass of
// decode_tiles_avx512.h and sgemm run instead.
// set_avx512_bf16_preferred overrides the default (tests cover both passes;
// benchmarks compare them).
bool use_avx512_bf16();
bool cpu_prefers_avx512_bf16();
void set_avx512_bf16_preferred(bool preferred);
// The preference alone (what set_avx512_bf16_preferred last set, else
// cpu_prefers_avx512_bf16()), whatever the CPU has.
bool avx512_bf16_preferred();

// True when the CPU has AVX-512 F, BW, VL and VNNI (checked once): int8 KV's
// decode score pass multiplies int8 keys by int8 queries with VPDPBUSD
// (decode_scores_vnni.h).
bool cpu_has_avx512_vnni();
// use_avx512() and the CPU has VNNI.
bool use_avx512_vnni();

// True when the CPU has AVX-512 F, BW, VL, BF16 and VBMI (checked once):
// E4M3 KV's decode score pass turns codes into BF16 with VPERMI2B and
// multiplies them with VDPBF16PS (decode_scores_fp8.h), whatever
// use_avx512_bf16() prefers: the alternative dequantizes whole tiles.
bool cpu_has_avx512_bf16_vbmi();
// use_avx512() and the CPU has BF16 and VBMI.
bool use_avx512_bf16_vbmi();

// True when the CPU has AMX-TILE and AMX-BF16 besides AVX-512 BF16, and the
// kernel granted this process the tile state (Linux hands it out only on
// request, arch_prctl ARCH_REQ_XCOMP_PERM, asked here once): the prefill
// GEMM for BF16 weights then multiplies 16 x 32 tiles with TDPBF16PS
// (gemm_bf16_amx.h).
bool cpu_has_amx_bf16();
// True when the AMX GEMM is to be used: use_avx512(), the CPU has it, it is
// not capped (BATON_MAX_CPU_ISA below amx) and not switched off with
// set_amx_enabled(false) (tests cover the paths beneath it on AMX machines).
bool use_amx_bf16();
void set_amx_enabled(bool enabled);

}  // namespace baton::kernels::cpu
