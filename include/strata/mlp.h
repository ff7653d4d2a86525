// The MLP driver: forward, loss and backward of one micro-batch on the CPU kernels or the
// CUDA kernels, calling hooks around every module so that an engine can supply (gather)
// parameters before a module runs and take (reduce) its gradients after its backward.
//
// Contract:
//  - Order of calls for ForwardBackward, with M modules:
//        for k in 0..M-1:  BeforeForward(k) -> compute -> AfterForward(k)
//        loss
//        for k in M-1..0:  BeforeBackward(k) -> compute -> AfterBackward(k)
//    Pointers returned by BeforeForward(k) are used only until AfterForward(k) returns;
//    those of BeforeBackward(k) only until AfterBackward(k). When AfterBackward(k) is called,
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
//    AfterBackward(k) is called once module k's backward has been enqueued: the hook must
//    order its own work after it on the stream (or synchronize) before reading gradients.
//    ForwardBackward on kCuda synchronizes the stream before returning.
//  - The driver owns its activation workspace (allocated on first use, grown when a larger
//    batch arrives, reused afterwards; device memory for kCuda). One driver is used by one
//    thread at a time.
#pragma once

#include <cstdint>
#include <vector>

#include "strata/model.h"
#include "strata/status.h"

namespace strata::model {

struct ModuleParams {
  DType dtype = DType::kF32;
  std::vector<const void*> tensors;
};

struct ModuleGrads {
  std::vector<float*> tensors;
  bool accumulate = false;  // add to the existing values (gradient accumulation)
};

struct ModuleBackward {
  ModuleParams params;
  ModuleGrads grads;
};

class MlpHooks {
 public:
  virtual ~MlpHooks() = default;
  virtual Result<ModuleParams> BeforeForward(int module) = 0;
  virtual Status AfterForward(int /*module*/) { return OkStatus(); }
  virtual Result<ModuleBackward> BeforeBackward(int module) = 0;
  virtual Status AfterBackward(int /*module*/) { return OkStatus(); }
};

enum class Backend { kCpu, kCuda };

class Mlp {
 public:
  // Requires ValidateSpec(spec).ok(). For kCuda, `stream` is the cudaStream_t to use
  // (nullptr: the default stream); in a build without CUDA the passes return Unavailable.
  explicit Mlp(MlpSpec spec, Backend backend = Backend::kCpu, void* stream = nullptr);
  ~Mlp();
  Mlp(const Mlp&) = delete;
  Mlp& operator=(const Mlp&) = delete;

  const MlpSpec& spec() const { return spec_; }
  const std::vector<ModuleSpec>& modules() const { return modules_; }

  // Forward, loss (divided by `normaliser`), backward. Returns the batch's loss term.
  // InvalidArgument when the batch does not match the spec.
  Result<double> ForwardBackward(const Batch& batch, double normaliser, MlpHooks& hooks);
  // Forward and loss only (AfterForward hooks run; no backward hooks).
  Result<double> Forward(const Batch& batch, double normaliser, MlpHooks& hooks);

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
  Result<double> Run(const Batch& batch, double normaliser, MlpHooks& hooks, bool backward);
  Status Upload(const Batch& batch);

  MlpSpec spec_;
  Backend backend_;
  void* stream_;
  std::vector<ModuleSpec> modules_;
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
// ready-made MlpHooks for tests and single-process training. Optionally keeps a 16-bit
// compute copy (refreshed by SyncCompute) that the forward and backward read instead of the
// fp32 values.
class DenseMlp : public MlpHooks {
 public:
  // Initialises parameters with InitTensorSlice; compute dtype kF32 uses the fp32 params.
  explicit DenseMlp(const MlpSpec& spec, DType compute = DType::kF32);

  std::vector<std::vector<float>>& params(int module) { return params_[module]; }
  std::vector<std::vector<float>>& grads(int module) { return grads_[module]; }
  int num_modules() const { return static_cast<int>(params_.size()); }
  // Rounds the fp32 params into the 16-bit copy (no-op for kF32).
  void SyncCompute();
  void ZeroGrads();
  // Next backward adds to the gradients instead of overwriting them.
  void set_accumulate(bool accumulate) { accumulate_ = accumulate; }
  // params -= lr * grads, then SyncCompute.
  void SgdStep(float lr);

  Result<ModuleParams> BeforeForward(int module) override;
  Result<ModuleBackward> BeforeBackward(int module) override;

 private:
  DType compute_;
  bool accumulate_ = false;
  std::vector<std::vector<std::vector<float>>> params_, grads_;
  std::vector<std::vector<std::vector<uint16_t>>> half_;
};

}  // namespace strata::model
