// kernels/cuda/cuda_status.h — every CUDA runtime call checked and turned into
// a Status that names the expression, file and line.
#pragma once

#include <cuda_runtime_api.h>

#include <string>

#include "common/status.h"

namespace baton::kernels::cuda {

inline Status cuda_status(cudaError_t error, const char* expr, const char* file, int line) {
  if (error == cudaSuccess) return Status::ok();
  return internal_error(std::string(expr) + " failed at " + file + ":" + std::to_string(line) +
                        ": " + cudaGetErrorName(error) + ": " + cudaGetErrorString(error));
}

}  // namespace baton::kernels::cuda

#define BATON_CUDA_RETURN_IF_ERROR(expr) \
  BATON_RETURN_IF_ERROR(::baton::kernels::cuda::cuda_status((expr), #expr, __FILE__, __LINE__))
