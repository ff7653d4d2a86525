// Adam and AdamW optimizer steps on the CPU (SIMD, oneTBB) and on a CUDA device.
//
// The update, for every element i of a tensor (t = params.step, counted from 1):
//   g  = grad[i] * grad_scale                        (fp32, bf16 or fp16 grads -> fp32)
//   g += weight_decay * p                            (Adam only: L2 decay)
//   m  = beta1 * m + (1 - beta1) * g
//   v  = beta2 * v + (1 - beta2) * g * g
//   p  = p * (1 - lr * weight_decay)                 (AdamW only: decoupled decay)
//   p -= (lr / (1 - beta1^t)) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
//   out16[i] = round_to_nearest_even(p)              (optional bf16 / fp16 copy)
// With bias_correction = false, the factors (1 - beta^t) are 1. This is the update of
// torch.optim.Adam/AdamW and of DeepSpeed's DeepSpeedCPUAdam.
//
// Precision contract (tested in tests/optim/adam_test.cc against AdamStepReference, which
// computes in double and rounds once): m, v and p from the fast paths are within a few fp32
// ulps per step of the reference's, relative to the magnitudes involved; the 16-bit copy
// is exactly the correctly rounded (RNE, see half.h) value of the fp32 p the same call
// wrote. Inputs must satisfy |grad * grad_scale| < 1.8e19 (its square must be a finite
// float); larger ones overflow v to inf exactly as torch's fp32 Adam does.
//
// Ownership and threads: the caller owns every buffer; the calls only read and write the
// given spans, allocate nothing per call, and may be called from any thread, concurrently
// on disjoint spans. Buffers need no particular alignment. The work is cut into
// cache-sized tiles run by oneTBB inside `arena` (the caller's, e.g. bound to one NUMA
// node's cores) or, when arena is null, in the calling thread's current arena.
//
// Errors: InvalidArgument for null pointers with n > 0, step < 1, non-finite or negative
// hyper-parameters, an fp32 `out` type; Unavailable/InvalidArgument when STRATA_ADAM_ISA
// forces an ISA this CPU lacks (cpu_isa.h). Buffers are untouched when a call fails.
#pragma once

#include <oneapi/tbb/task_arena.h>

#include <cstddef>
#include <cstdint>
#include <span>

#include "strata/cpu_isa.h"
#include "strata/half.h"
#include "strata/status.h"

namespace strata {

struct AdamParams {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;
  bool adamw = true;            // true: decoupled decay (AdamW); false: L2 decay (Adam)
  bool bias_correction = true;  // DeepSpeed's bias_correction flag
  int64_t step = 1;             // the step being taken, counted from 1 (per group)
  float grad_scale = 1.0f;      // grads are multiplied by this: 1/loss_scale * clip factor
};

// A gradient buffer: fp32, bf16 or fp16 elements (converted to fp32 in registers).
struct GradView {
  const void* data = nullptr;
  DType type = DType::kF32;
};

// Optional 16-bit destination for the updated parameters (data == nullptr: none).
// type must be kBf16 or kFp16.
struct Copy16 {
  void* data = nullptr;
  DType type = DType::kBf16;
};

// One tensor (or shard) of a multi-tensor step; `params` points at its group's
// hyper-parameters and step count (many tensors may share one AdamParams).
struct AdamTensor {
  const AdamParams* params = nullptr;
  float* master = nullptr;  // fp32 parameters, updated in place
  float* m = nullptr;       // first moment, updated in place
  float* v = nullptr;       // second moment, updated in place
  GradView grad;
  Copy16 out;
  size_t n = 0;
};

// One step over n elements with the active CPU ISA (cpu_isa.h).
Status AdamStep(const AdamParams& params, float* master, float* m, float* v, GradView grad, size_t n,
                Copy16 out = {}, tbb::task_arena* arena = nullptr);

// One step over many tensors, each with its group's params, in one parallel pass.
Status AdamStep(std::span<const AdamTensor> tensors, tbb::task_arena* arena = nullptr);

// Same as AdamStep(params, ...) but with an explicit ISA (tests, benchmarks); Unavailable
// if this CPU lacks it. Runs in the calling thread only when arena is null and the
// calling thread's arena has one slot; otherwise as AdamStep.
Status AdamStepWithIsa(CpuIsa isa, const AdamParams& params, float* master, float* m, float* v, GradView grad,
                       size_t n, Copy16 out = {}, tbb::task_arena* arena = nullptr);

// The plain reference: scalar, one thread, every intermediate in double, each result
// rounded once to fp32 (and the 16-bit copy rounded from that fp32). Slow; for tests and
// for checking other implementations.
Status AdamStepReference(const AdamParams& params, float* master, float* m, float* v, GradView grad, size_t n,
                         Copy16 out = {});

// Checks params (and, for n > 0, the pointers); the validation every entry point runs.
Status ValidateAdam(const AdamParams& params, const float* master, const float* m, const float* v,
                    GradView grad, size_t n, Copy16 out);

// ---- CUDA (fused multi-tensor AdamW) -------------------------------------------------
// Same update and rounding as above, for tensors whose pointers are device memory: every
// tensor in one launch per batch of tensors, enqueued on `cuda_stream` (a cudaStream_t
// passed as void*; null = the legacy default stream). Asynchronous: returns after
// enqueueing; the caller synchronizes the stream before reading results or reusing the
// `tensors` array's buffers (the array itself may be freed on return). Launch errors are
// returned as Internal/Unavailable with the CUDA error text. Unavailable in a build
// without CUDA (STRATA_HAVE_CUDA undefined).
Status AdamStepCuda(std::span<const AdamTensor> tensors, void* cuda_stream);

// True when this build has the CUDA kernels (not whether a GPU is present).
bool AdamCudaBuilt();

}  // namespace strata
