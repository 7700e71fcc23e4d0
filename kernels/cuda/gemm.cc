#include "kernels/cuda/gemm.h"

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <map>
#include <string>
#include <tuple>

#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/device.h"

namespace baton::kernels::cuda {
namespace {

Status cublas_status(cublasStatus_t s, const char* expr, const char* file, int line) {
  if (s == CUBLAS_STATUS_SUCCESS) return Status::ok();
  return internal_error(std::string(expr) + " failed at " + file + ":" + std::to_string(line) +
                        ": cuBLAS status " + std::to_string(int(s)));
}

#define BATON_CUBLAS_RETURN_IF_ERROR(expr) \
  BATON_RETURN_IF_ERROR(cublas_status((expr), #expr, __FILE__, __LINE__))

cudaDataType_t cuda_type(DType t) {
  switch (t) {
    case DType::kF32:
      return CUDA_R_32F;
    case DType::kF16:
      return CUDA_R_16F;
    case DType::kBF16:
      return CUDA_R_16BF;
    case DType::kI8:
    case DType::kFP8E4M3:
      break;  // KV formats: the GEMMs never see them
  }
  return CUDA_R_32F;
}

// One shape's descriptors and the algorithm chosen for it.
struct Plan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
};

using PlanKey = std::tuple<int64_t, int64_t, int64_t, DType, DType, bool>;

class LtGemm final : public Gemm {
 public:
  LtGemm(cublasLtHandle_t handle, DeviceBuffer workspace)
      : handle_(handle), workspace_(std::move(workspace)) {}

  ~LtGemm() override {
    for (auto& [key, plan] : plans_) destroy(plan);
    cublasLtDestroy(handle_);
  }

  Status run(const GemmArgs& g, void* stream) override {
    if (g.m == 0) return Status::ok();
    if ((g.dtype != DType::kBF16 && g.dtype != DType::kF16) ||
        (g.out_dtype != g.dtype && g.out_dtype != DType::kF32)) {
      return invalid_argument(
          "cuBLASLt GEMM takes BF16 or F16 inputs with an output of the same "
          "dtype or F32");
    }
    // The bias is read in the output's dtype (gemm.h): an F32 output would
    // read a half-precision bias as floats.
    if (g.bias != nullptr && g.out_dtype != g.dtype)
      return invalid_argument(
          "cuBLASLt GEMM takes a bias only with an output of the inputs' dtype");
    const PlanKey key{g.m, g.n, g.k, g.dtype, g.out_dtype, g.bias != nullptr};
    auto it = plans_.find(key);
    if (it == plans_.end()) {
      Plan plan;
      Status made = make_plan(g, plan);
      if (!made.is_ok()) {
        destroy(plan);
        return made;
      }
      it = plans_.emplace(key, plan).first;
    }
    Plan& plan = it->second;
    if (g.bias != nullptr) {
      BATON_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(
          plan.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &g.bias, sizeof(g.bias)));
    }
    const float alpha = g.alpha, beta = 0.0f;
    // Column-major view: outᵀ[n, m] = w[n, k] · xᵀ[k, m], with w (row-major
    // [n, k]) read as a transposed column-major [k, n].
    BATON_CUBLAS_RETURN_IF_ERROR(cublasLtMatmul(
        handle_, plan.op, &alpha, g.w, plan.a, g.x, plan.b, &beta, g.out, plan.c, g.out, plan.c,
        &plan.algo, workspace_.data(), workspace_.bytes(), static_cast<cudaStream_t>(stream)));
    return Status::ok();
  }

 private:
  static void destroy(Plan& p) {
    if (p.a) cublasLtMatrixLayoutDestroy(p.a);
    if (p.b) cublasLtMatrixLayoutDestroy(p.b);
    if (p.c) cublasLtMatrixLayoutDestroy(p.c);
    if (p.op) cublasLtMatmulDescDestroy(p.op);
    p = Plan{};
  }

  Status make_plan(const GemmArgs& g, Plan& p) {
    BATON_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescCreate(&p.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t transpose = CUBLAS_OP_T, keep = CUBLAS_OP_N;
    BATON_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSA,
                                                                &transpose, sizeof(transpose)));
    BATON_CUBLAS_RETURN_IF_ERROR(
        cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSB, &keep, sizeof(keep)));
    if (g.bias != nullptr) {
      const cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
      BATON_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(
          p.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue)));
      const cudaDataType_t bias_type = cuda_type(g.dtype);
      BATON_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(
          p.op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type, sizeof(bias_type)));
      // The heuristic reads the pointer's alignment from it.
      BATON_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(
          p.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &g.bias, sizeof(g.bias)));
    }
    const cudaDataType_t in = cuda_type(g.dtype), out = cuda_type(g.out_dtype);
    BATON_CUBLAS_RETURN_IF_ERROR(
        cublasLtMatrixLayoutCreate(&p.a, in, uint64_t(g.k), uint64_t(g.n), g.k));
    BATON_CUBLAS_RETURN_IF_ERROR(
        cublasLtMatrixLayoutCreate(&p.b, in, uint64_t(g.k), uint64_t(g.m), g.k));
    BATON_CUBLAS_RETURN_IF_ERROR(
        cublasLtMatrixLayoutCreate(&p.c, out, uint64_t(g.n), uint64_t(g.m), g.n));

    cublasLtMatmulPreference_t preference = nullptr;
    BATON_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulPreferenceCreate(&preference));
    const size_t workspace = workspace_.bytes();
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    cublasStatus_t asked = cublasLtMatmulPreferenceSetAttribute(
        preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace, sizeof(workspace));
    if (asked == CUBLAS_STATUS_SUCCESS) {
      asked = cublasLtMatmulAlgoGetHeuristic(handle_, p.op, p.a, p.b, p.c, p.c, preference, 1,
                                             &result, &found);
    }
    cublasLtMatmulPreferenceDestroy(preference);
    BATON_CUBLAS_RETURN_IF_ERROR(asked);
    if (found == 0) {
      return unimplemented("cuBLASLt has no algorithm for a GEMM of m " + std::to_string(g.m) +
                           ", n " + std::to_string(g.n) + ", k " + std::to_string(g.k));
    }
    p.algo = result.algo;
    return Status::ok();
  }

  cublasLtHandle_t handle_;
  DeviceBuffer workspace_;
  std::map<PlanKey, Plan> plans_;
};

}  // namespace

Result<std::unique_ptr<Gemm>> Gemm::create(size_t workspace_bytes) {
  BATON_ASSIGN_OR_RETURN(DeviceBuffer workspace, DeviceBuffer::allocate(workspace_bytes));
  cublasLtHandle_t handle = nullptr;
  BATON_CUBLAS_RETURN_IF_ERROR(cublasLtCreate(&handle));
  return std::unique_ptr<Gemm>(new LtGemm(handle, std::move(workspace)));
}

}  // namespace baton::kernels::cuda
