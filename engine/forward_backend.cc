#include "engine/forward_backend.h"

#include "engine/cpu_forward.h"
#if BATON_HAVE_CUDA
#include "engine/cuda_forward.h"
#include "kernels/cuda/device.h"
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
  return check_device_present(device);  // the error that says why
#endif
}

Status check_device_present(const Device& device) {
  if (!device.is_cuda()) return Status::ok();
#if BATON_HAVE_CUDA
  const int count = kernels::cuda::device_count();
  if (device.index < count) return Status::ok();
  std::string why = count == 0 ? " (" + kernels::cuda::device_count_error() + ")" : "";
  return invalid_argument("engine.device " + device.name() + ": this machine has " +
                          std::to_string(count) + " CUDA device" + (count == 1 ? "" : "s") + why);
#else
  return invalid_argument("engine.device " + device.name() +
                          ": this build of Baton has no CUDA backend (nvcc was not found when it "
                          "was built)");
#endif
}

}  // namespace baton::engine
