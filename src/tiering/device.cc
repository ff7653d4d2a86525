// CreateDevice: picks the backend.
#include "strata/device.h"

#include "strata/log.h"
#include "tiering/device_backends.h"

namespace strata {

std::string_view CopyDirName(CopyDir dir) {
  switch (dir) {
    case CopyDir::kHostToDevice: return "H2D";
    case CopyDir::kDeviceToHost: return "D2H";
    case CopyDir::kDeviceToDevice: return "D2D";
  }
  return "?";
}

namespace tiering {
Status CudaUnavailable(const CudaProbe& probe) {
  return UnavailableError(
      "cuda device requested but none is usable: " + probe.reason +
      "; use --device sim (or \"strata\": {\"device\": \"sim\"}) to run on the simulated device");
}
}  // namespace tiering

Result<std::unique_ptr<Device>> CreateDevice(const DeviceOptions& options) {
  if (options.index < 0)
    return InvalidArgumentError("device index must be >= 0, got " + std::to_string(options.index));
  switch (options.kind) {
    case DeviceKind::kSim:
      return tiering::CreateSimDevice(options.capacity == 0 ? kDefaultSimCapacity : options.capacity);
    case DeviceKind::kCuda: {
      CudaProbe probe = ProbeCuda();
      if (!probe.available) return tiering::CudaUnavailable(probe);
      return tiering::CreateCudaDevice(options);
    }
    case DeviceKind::kAuto: {
      CudaProbe probe = ProbeCuda();
      if (probe.available) return tiering::CreateCudaDevice(options);
      STRATA_LOG(kDebug, "device") << "auto: using the sim device (" << probe.reason << ")";
      return tiering::CreateSimDevice(options.capacity == 0 ? kDefaultSimCapacity : options.capacity);
    }
  }
  return InvalidArgumentError("unknown device kind");
}

}  // namespace strata
