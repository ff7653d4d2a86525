// Internal: the per-ISA kernel table behind AdamStep and ComputeGradStats. Each ISA's
// kernels live in their own file compiled with that ISA's flags (src/CMakeLists.txt);
// nothing here may be called on a CPU that lacks the ISA (cpu_isa.cc guards it).
#pragma once

#include <cstddef>

#include "strata/adam.h"
#include "strata/cpu_isa.h"
#include "strata/grad_stats.h"

namespace strata::optim {

// AdamParams folded into the per-element constants (computed in double, rounded once).
struct AdamConsts {
  float beta1, one_minus_beta1;
  float beta2, one_minus_beta2;
  float eps;
  float step_size;     // lr / (1 - beta1^t)
  float inv_sqrt_bc2;  // 1 / sqrt(1 - beta2^t)
  float decay;         // AdamW: 1 - lr * weight_decay; Adam: 1
  float l2;            // Adam: weight_decay; AdamW: 0
  float grad_scale;
};
AdamConsts MakeAdamConsts(const AdamParams& p);

// Updates elements [begin, end) of one tensor. The grad and out pointers are the
// tensor's base pointers (the kernel offsets them).
using AdamKernelFn = void (*)(const AdamConsts& c, float* p, float* m, float* v, GradView g, Copy16 out,
                              size_t begin, size_t end);
// Adds the squares of elements [begin, end) to *sum_sq and ORs non-finiteness into *bad.
using GradStatsKernelFn = void (*)(GradView g, size_t begin, size_t end, double* sum_sq, bool* bad);
// Adam's memory traffic without its arithmetic (the bandwidth limit pass of the
// benchmark): reads p, m, v and fp32 g; writes p, m, v back in place and a 16-bit value
// per element to out16 (may be null: no copy).
using TrafficKernelFn = void (*)(float* p, float* m, float* v, const float* g, void* out16, size_t begin,
                                 size_t end);

struct Kernels {
  AdamKernelFn adam;
  GradStatsKernelFn grad_stats;
  TrafficKernelFn traffic;
};

const Kernels& ScalarKernels();
const Kernels& Avx2Kernels();
const Kernels& Avx512Kernels();
const Kernels& Avx512Bf16Kernels();
// The table for `isa` (the caller has checked CpuSupports(isa)).
const Kernels& KernelsFor(CpuIsa isa);

// Elements per parallel task: large enough that scheduling costs nothing next to the
// ~22 bytes of traffic per element, small enough that a tile's working set stays in
// L2 and the work splits evenly over the threads.
inline constexpr size_t kTileElems = size_t{1} << 14;

}  // namespace strata::optim
