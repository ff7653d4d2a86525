// Build without CUDA: the GPU optimizer entry points report that they are missing.
#include "strata/adam.h"
#include "strata/grad_stats.h"

namespace strata {

bool AdamCudaBuilt() { return false; }

Status AdamStepCuda(std::span<const AdamTensor>, void*) {
  return UnavailableError(
      "AdamStepCuda: this strata build has no CUDA (configure with STRATA_CUDA=ON and a CUDA toolkit)");
}

Result<GradStats> ComputeGradStatsCuda(std::span<const GradShard>, void*) {
  return UnavailableError(
      "ComputeGradStatsCuda: this strata build has no CUDA (configure with STRATA_CUDA=ON and a CUDA "
      "toolkit)");
}

}  // namespace strata
