#include "engine/forward_backend.h"

#include "engine/cpu_forward.h"
#if BATON_HAVE_CUDA
#include "engine/cuda_forward.h"
#endif

namespace baton::engine {

Result<std::unique_ptr<ForwardBackend>> make_forward_backend(const Device& device,
                                                             const Checkpoint& checkpoint,
                                                             int32_t threads) {
  if (!device.is_cuda())
    return std::unique_ptr<ForwardBackend>(new CpuForward(checkpoint, threads));
#if BATON_HAVE_CUDA
  return make_cuda_forward(device.index, checkpoint);
#else
  return invalid_argument("engine.device " + device.name() +
                          ": this build of Baton has no CUDA backend (nvcc was not found when it "
                          "was built)");
#endif
}

}  // namespace baton::engine
