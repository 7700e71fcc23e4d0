// common/host_device.h — lets small inline helpers (dtype conversion, KV
// layout offsets) compile for both the host and CUDA kernels.
#pragma once

#if defined(__CUDACC__)
#define BATON_HOST_DEVICE __host__ __device__
#else
#define BATON_HOST_DEVICE
#endif
