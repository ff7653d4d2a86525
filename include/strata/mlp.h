// The MLP driver: forward, loss and backward of one micro-batch on the CPU kernels or the
// CUDA kernels, calling hooks around every module so that an engine can supply (gather)
// parameters before a module runs and take (reduce) its gradients after its backward.
//
// Contract:
//  - Order of calls for ForwardBackward, with M modules:
//        for k in 0..M-1:  Fetch(k) -> compute -> Release(k)
//        loss
//        for k in M-1..0:  BeginBackward(k) -> compute -> EndBackward(k)
//    Pointers returned by Fetch(k) are used only until Release(k) returns;
//    those of BeginBackward(k) only until EndBackward(k). When EndBackward(k) is called,
//    module k's gradients are completely written.
//  - ModuleParams::tensors / ModuleGrads::tensors follow the module's tensor order in
//    MlpModules (weight, then bias); params are of `dtype`, grads fp32.
//  - A hook that fails stops the pass and its Status is returned (with the module named);
//    gradients may then be partly written.
//  - Backend kCpu: hook pointers are host memory, the kernels run on oneTBB threads inside
//    the call. Backend kCuda: hook pointers are device memory, every kernel is enqueued on
//    the driver's stream (a cudaStream_t as void*); the batch is copied from the host to the
//    device, and the call returns after the loss has been read back (so the stream has run
//    the forward pass and loss); backward kernels are enqueued in order on the stream, and
//    EndBackward(k) is called once module k's backward has been enqueued: the hook must
//    order its own work after it on the stream (or synchronize) before reading gradients.
//    ForwardBackward on kCuda synchronizes the stream before returning.
//  - The driver owns its activation workspace (allocated on first use, grown when a larger
//    batch arrives, reused afterwards; device memory for kCuda). One driver is used by one
//    thread at a time.
#pragma once

#include <cstdint>
#include <vector>

#include "strata/model.h"
#include "strata/module_hooks.h"
#include "strata/status.h"

namespace strata::model {

using ::strata::Backend;

class Mlp {
 public:
  // Requires ValidateSpec(spec).ok(). For kCuda, `stream` is the cudaStream_t to use
  // (nullptr: the default stream); in a build without CUDA the passes return Unavailable.
  explicit Mlp(MlpSpec spec, Backend backend = Backend::kCpu, void* stream = nullptr);
  ~Mlp();
  Mlp(const Mlp&) = delete;
  Mlp& operator=(const Mlp&) = delete;

  const MlpSpec& spec() const { return spec_; }
  const ModelDecl& modules() const { return modules_; }

  // Forward, loss (divided by `normaliser`), backward. Returns the batch's loss term.
  // InvalidArgument when the batch does not match the spec.
  Result<double> ForwardBackward(const Batch& batch, double normaliser, ModuleHooks& hooks);
  // Forward and loss only (Release hooks run; no backward hooks).
  Result<double> Forward(const Batch& batch, double normaliser, ModuleHooks& hooks);

  // The output of the last layer of the latest pass, [batch, output_dim] (a device
  // pointer for kCuda).
  const float* output() const { return pre_.back().ptr; }

 private:
  // Workspace: host memory (kCpu) or device memory (kCuda), grown, never shrunk.
  struct Buffer {
    float* ptr = nullptr;
    size_t capacity = 0;  // in floats
    std::vector<float> host;
  };
  Status Ensure(Buffer& buffer, int64_t floats);
  // The one accumulate flag the Linear kernels take for a layer's weight and bias: when
  // the hooks' flags differ, the tensor to overwrite is zeroed first and both add.
  Result<bool> AccumulateBoth(const ModuleGrads& grads, int layer);
  Result<double> Run(const Batch& batch, double normaliser, ModuleHooks& hooks, bool backward);
  Status Upload(const Batch& batch);

  MlpSpec spec_;
  Backend backend_;
  void* stream_;
  ModelDecl modules_;
  std::vector<int64_t> dims_;
  // pre_[k]: output of layer k (before its GELU); acts_[k]: input of layer k, the GELU of
  // pre_[k - 1] (acts_[0]: the batch's x on kCuda, unused on kCpu). pre_.back() is the
  // model output.
  std::vector<Buffer> acts_, pre_;
  Buffer grad_a_, grad_b_;
  Buffer targets_, labels_, sample_loss_;  // kCuda only (labels_ holds int32 bit patterns)
  std::vector<float> sample_loss_host_;
};

// Parameters and gradients of a whole MLP, dense in memory: the unsharded reference, and a
// ready-made ModuleHooks for tests and single-process training. Optionally keeps a 16-bit
// compute copy (refreshed by SyncCompute) that the forward and backward read instead of the
// fp32 values.
class DenseMlp : public ModuleHooks {
 public:
  // Initialises parameters with InitTensorSlice; compute dtype kF32 uses the fp32 params.
  explicit DenseMlp(const MlpSpec& spec, DType compute = DType::kF32);

  std::vector<std::vector<float>>& params(int module) { return params_[module]; }
  std::vector<std::vector<float>>& grads(int module) { return grads_[module]; }
  int num_modules() const { return static_cast<int>(params_.size()); }
  // Rounds the fp32 params into the 16-bit copy (no-op for kF32).
  void SyncCompute();
  void ZeroGrads();
  // Next backward adds to the gradients instead of overwriting them (both tensors).
  void set_accumulate(bool accumulate) { accumulate_ = accumulate; }
  // params -= lr * grads, then SyncCompute.
  void SgdStep(float lr);

  Result<ModuleParams> Fetch(int module) override;
  Result<ModuleBackward> BeginBackward(int module) override;

 private:
  DType compute_;
  bool accumulate_ = false;
  std::vector<std::vector<std::vector<float>>> params_, grads_;
  std::vector<std::vector<std::vector<uint16_t>>> half_;
};

}  // namespace strata::model
