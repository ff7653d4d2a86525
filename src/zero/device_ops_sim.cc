// Device ops on host memory, and on the sim device (whose memory is host memory): the
// CPU loops and kernels the engine ran inline before the seam existed, unchanged (the
// sim engine's results are bit-identical across that change).
#include <cstring>

#include "strata/half.h"
#include "strata/mlp_kernels.h"
#include "zero/device_ops.h"

namespace strata::zero {

Status AdamOnHost(const AdamParams& p, float* st, int64_t n, const float* grad, DType compute, void* out,
                  tbb::task_arena* arena) {
  Copy16 c16;
  if (compute != DType::kF32) c16 = Copy16{out, compute};
  STRATA_RETURN_IF_ERROR(AdamStep(p, st, st + n, st + 2 * n, GradView{grad, DType::kF32}, n, c16, arena));
  if (compute == DType::kF32 && out != nullptr) std::memcpy(out, st, n * 4);
  return OkStatus();
}

namespace {

class HostOps : public DeviceOps {
 public:
  Backend model_backend() const override { return Backend::kCpu; }
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
  Status ReadToHost(OpsLane lane, void* host, const void* dev, uint64_t bytes) override {
    return Copy(lane, host, dev, bytes);
  }
  Status WriteFromHost(OpsLane lane, void* dev, const void* host, uint64_t bytes) override {
    return Copy(lane, dev, host, bytes);
  }
  Status Accumulate(OpsLane, float* dst, const float* src, int64_t n) override {
    for (int64_t i = 0; i < n; ++i) dst[i] += src[i];
    return OkStatus();
  }
  Status AddGradient(OpsLane, float* dst, const void* src, DType dtype, int64_t n, bool overwrite) override {
    auto add = [&](auto convert) {
      for (int64_t i = 0; i < n; ++i) dst[i] = (overwrite ? 0.0f : dst[i]) + convert(i);
    };
    switch (dtype) {
      case DType::kF32: add([src](int64_t i) { return static_cast<const float*>(src)[i]; }); break;
      case DType::kBf16:
        add([src](int64_t i) { return Bf16ToFloat(static_cast<const Bf16*>(src)[i]); });
        break;
      case DType::kFp16:
        add([src](int64_t i) { return Fp16ToFloat(static_cast<const Fp16*>(src)[i]); });
        break;
      default:
        return InvalidArgumentError("gradient of dtype " + std::string(DTypeName(dtype)) +
                                    ": use fp32, bf16 or fp16");
    }
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
    return AdamOnHost(params, state, n, grad, compute, out, nullptr);
  }
};

// The sim device's memory is host memory: the host ops, except that the device-tier
// Adam runs on the device's compute stream, as the device's own work.
class SimDeviceOps final : public HostOps {
 public:
  SimDeviceOps(Device& device, StreamId compute_stream) : device_(device), compute_stream_(compute_stream) {}

  Status Adam(OpsLane lane, const AdamParams& params, float* state, int64_t n, const float* grad,
              DType compute, void* out) override {
    Status s = device_.Enqueue(compute_stream_,
                               [&] { return HostOps::Adam(lane, params, state, n, grad, compute, out); });
    if (s.ok()) s = device_.Synchronize(compute_stream_);
    return s;
  }

 private:
  Device& device_;
  StreamId compute_stream_;
};

}  // namespace

DeviceOps& HostMemoryOps() {
  static HostOps ops;
  return ops;
}

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
