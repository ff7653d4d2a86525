// Device ops on the sim device: its memory is host memory, so these are the CPU loops
// and kernels the engine ran inline before the seam existed, unchanged (the sim engine's
// results are bit-identical across that change), and the device-tier Adam on the
// device's compute stream as before.
#include <cstring>

#include "strata/half.h"
#include "strata/mlp_kernels.h"
#include "zero/device_ops.h"

namespace strata::zero {
namespace {

class SimDeviceOps final : public DeviceOps {
 public:
  SimDeviceOps(Device& device, StreamId compute_stream) : device_(device), compute_stream_(compute_stream) {}

  model::Backend model_backend() const override { return model::Backend::kCpu; }
  void* model_stream() const override { return nullptr; }
  Status WaitForModel() override { return OkStatus(); }

  Status Zero(OpsLane, void* dst, uint64_t bytes) override {
    std::memset(dst, 0, bytes);
    return OkStatus();
  }
  Status Copy(OpsLane, void* dst, const void* src, uint64_t bytes) override {
    std::memcpy(dst, src, bytes);
    return OkStatus();
  }
  Status ReadToHost(OpsLane, void* host, const void* dev, uint64_t bytes) override {
    std::memcpy(host, dev, bytes);
    return OkStatus();
  }
  Status WriteFromHost(OpsLane, void* dev, const void* host, uint64_t bytes) override {
    std::memcpy(dev, host, bytes);
    return OkStatus();
  }
  Status Accumulate(OpsLane, float* dst, const float* src, int64_t n) override {
    for (int64_t i = 0; i < n; ++i) dst[i] += src[i];
    return OkStatus();
  }
  Status RoundThroughFp16(OpsLane, float* x, int64_t n) override {
    for (int64_t i = 0; i < n; ++i) x[i] = Fp16ToFloat(FloatToFp16(x[i]));
    return OkStatus();
  }
  Result<GradStats> ComputeStats(OpsLane, std::span<const GradShard> shards,
                                 tbb::task_arena* arena) override {
    return ComputeGradStats(shards, arena);
  }
  Status Adam(OpsLane, const AdamParams& params, float* state, int64_t n, const float* grad, DType compute,
              void* out) override {
    // The device computes: on the sim device that is the CPU Adam on its compute stream.
    Status s = device_.Enqueue(compute_stream_, [&] {
      Copy16 c16;
      if (compute != DType::kF32) c16 = Copy16{out, compute};
      STRATA_RETURN_IF_ERROR(
          AdamStep(params, state, state + n, state + 2 * n, GradView{grad, DType::kF32}, n, c16, nullptr));
      if (compute == DType::kF32) std::memcpy(out, state, n * 4);
      return OkStatus();
    });
    if (s.ok()) s = device_.Synchronize(compute_stream_);
    return s;
  }

 private:
  Device& device_;
  StreamId compute_stream_;
};

}  // namespace

std::unique_ptr<DeviceOps> CreateSimDeviceOps(Device& device, StreamId compute_stream) {
  return std::make_unique<SimDeviceOps>(device, compute_stream);
}

Result<std::unique_ptr<DeviceOps>> CreateDeviceOps(Device& device, StreamId compute_stream) {
  switch (device.kind()) {
    case DeviceKind::kCuda: return CreateCudaDeviceOps(device, compute_stream);
    case DeviceKind::kSim:
      if (!device.host_accessible()) break;
      return CreateSimDeviceOps(device, compute_stream);
    case DeviceKind::kAuto: break;
  }
  return InvalidArgumentError(
      "engine: no device ops for device " + device.name() +
      " (a sim device must be host-accessible; kind auto is resolved by CreateDevice)");
}

}  // namespace strata::zero
