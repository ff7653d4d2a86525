// A build without CUDA: the engine cannot compute on a CUDA device, and says why.
#include "zero/device_ops.h"

namespace strata::zero {

Result<std::unique_ptr<DeviceOps>> CreateCudaDeviceOps(Device& device, StreamId) {
  return UnavailableError("engine: training on " + device.name() +
                          " needs CUDA, but strata was built without it (rebuild with STRATA_CUDA=ON on a "
                          "machine with the CUDA toolkit and NCCL), or use strata.device \"sim\"");
}

}  // namespace strata::zero
