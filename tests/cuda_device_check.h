// tests/cuda_device_check.h — when a CUDA test may skip.
//
// Only where this machine shows no NVIDIA GPU at all, judged without CUDA (the
// driver's device files). Where it shows one, CUDA must find it: a driver the
// runtime cannot use, or any other CUDA error, fails the test instead of
// reading as "no device".
#pragma once

#include <gtest/gtest.h>

#include <filesystem>

#include "kernels/cuda/device.h"

namespace baton::testing {

inline bool machine_shows_an_nvidia_gpu() {
  return std::filesystem::exists("/dev/nvidiactl") || std::filesystem::exists("/dev/nvidia0") ||
         std::filesystem::exists("/proc/driver/nvidia/version");
}

}  // namespace baton::testing

#define BATON_SKIP_WITHOUT_NVIDIA_GPU()                                                 \
  do {                                                                                  \
    if (!::baton::testing::machine_shows_an_nvidia_gpu())                               \
      GTEST_SKIP() << "no NVIDIA GPU on this machine (no /dev/nvidiactl, /dev/nvidia0 " \
                      "or /proc/driver/nvidia)";                                        \
    ASSERT_GT(::baton::kernels::cuda::device_count(), 0)                                \
        << "this machine shows an NVIDIA GPU, but CUDA finds no device: "               \
        << ::baton::kernels::cuda::device_count_error();                                \
  } while (0)
