// The engine's arithmetic and copies on device memory, behind one seam: the engine's
// code is the same for both device kinds, and only this interface knows whether device
// memory is host-addressable (sim: the CPU kernels the engine has always used) or HBM
// (cuda: kernels on streams of the engine's device).
//
// Contract (both implementations):
//  - Pointers named `dev` / `dst` / `src` (and the gradient, state and output pointers)
//    are memory of the engine's Device (Device::Allocate, or offsets into it); `host`
//    pointers are host memory (pinned or pageable).
//  - Every call is complete when it returns: the results are in memory and the buffers
//    may be reused or handed to another stream, a collective or the host. That is what
//    lets the engine order its work across threads by the host alone (the sim device
//    always worked that way).
//  - `lane` names the engine thread that calls (training loop, comm worker, optimizer
//    worker). cuda runs each lane on a stream of its own, so that the lanes overlap on
//    the GPU; sim ignores it. Calls from several threads on one lane are still correct,
//    only serialised.
//  - Errors: the CUDA error (Internal/ResourceExhausted) with what failed; on sim, the
//    CPU kernels' argument errors. The engine wraps them with its own context.
#pragma once

#include <oneapi/tbb/task_arena.h>

#include <cstdint>
#include <memory>
#include <span>

#include "strata/adam.h"
#include "strata/device.h"
#include "strata/grad_stats.h"
#include "strata/module_hooks.h"
#include "strata/status.h"

namespace strata::zero {

enum class OpsLane { kTraining, kReduce, kOptimizer };

class DeviceOps {
 public:
  virtual ~DeviceOps() = default;

  // How the model runs its kernels on this device: kCpu on sim (the hooks' pointers
  // are host-addressable), kCuda on a GPU with model_stream() as its cudaStream_t.
  virtual Backend model_backend() const = 0;
  virtual void* model_stream() const = 0;
  // Waits until the model's kernels enqueued so far have run (cuda: its stream;
  // sim: nothing, the CPU model is done when the hook is called).
  virtual Status WaitForModel() = 0;

  virtual Status Zero(OpsLane lane, void* dst, uint64_t bytes) = 0;
  virtual Status Copy(OpsLane lane, void* dst, const void* src, uint64_t bytes) = 0;
  virtual Status ReadToHost(OpsLane lane, void* host, const void* dev, uint64_t bytes) = 0;
  virtual Status WriteFromHost(OpsLane lane, void* dev, const void* host, uint64_t bytes) = 0;
  // dst[i] += src[i], fp32.
  virtual Status Accumulate(OpsLane lane, float* dst, const float* src, int64_t n) = 0;
  // dst[i] = (overwrite ? 0 : dst[i]) + float(src[i]) for src of `dtype` (fp32, bf16 or
  // fp16 bit patterns): a gradient handed in by code with its own autograd.
  virtual Status AddGradient(OpsLane lane, float* dst, const void* src, DType dtype, int64_t n,
                             bool overwrite) = 0;
  // x[i] = float(fp16(x[i])), round to nearest even: fp16 training's reduced gradient
  // (values past the fp16 range become inf, the overflow the loss scaler sees).
  virtual Status RoundThroughFp16(OpsLane lane, float* x, int64_t n) = 0;
  // Inf/NaN and sum of squares over fp32 shards (grad_stats.h). arena: sim only.
  virtual Result<GradStats> ComputeStats(OpsLane lane, std::span<const GradShard> shards,
                                         tbb::task_arena* arena = nullptr) = 0;
  // One Adam step over state = master | m | v (n each) with the fp32 gradient, writing
  // the updated compute copy (compute dtype; fp32 copies the master) to out.
  virtual Status Adam(OpsLane lane, const AdamParams& params, float* state, int64_t n, const float* grad,
                      DType compute, void* out) = 0;
};

// Picks the implementation by device.kind(). compute_stream: the engine's compute
// stream (sim runs the device-tier Adam on it; cuda runs the model on it). cuda in a
// build without CUDA is Unavailable. The Device must outlive the result.
Result<std::unique_ptr<DeviceOps>> CreateDeviceOps(Device& device, StreamId compute_stream);

// The implementations: device_ops_sim.cc, and cuda/device_ops_cuda.cc (a build without
// CUDA links nocuda/device_ops_unavailable.cc instead, which refuses with Unavailable).
std::unique_ptr<DeviceOps> CreateSimDeviceOps(Device& device, StreamId compute_stream);
Result<std::unique_ptr<DeviceOps>> CreateCudaDeviceOps(Device& device, StreamId compute_stream);

// The same operations on host memory, run on the calling thread (Adam with AdamOnHost,
// no arena): what the engine uses for buffers on the host tier, whatever the device.
// The sim device's ops are these, with its Adam on the device's compute stream.
DeviceOps& HostMemoryOps();

// One CPU Adam step over st = master | m | v (n each) with the fp32 gradient, writing
// the compute copy to out (16-bit, or fp32 as a copy of the master; in fp32 out may be
// null, when no one needs the copy). arena: where its
// oneTBB tasks run (nullptr: the caller's).
Status AdamOnHost(const AdamParams& p, float* st, int64_t n, const float* grad, DType compute, void* out,
                  tbb::task_arena* arena);

}  // namespace strata::zero
