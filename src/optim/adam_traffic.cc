// The bandwidth-limit pass of the Adam benchmark (see bench_support.h).
#include <string>

#include "optim/bench_support.h"
#include "optim/kernels.h"
#include "optim/parallel.h"

namespace strata::optim {

Status AdamTrafficPass(CpuIsa isa, float* p, float* m, float* v, const float* g, void* out16, size_t n,
                       tbb::task_arena* arena) {
  if (!CpuSupports(isa)) {
    return UnavailableError("AdamTrafficPass: CPU instruction set " + std::string(CpuIsaName(isa)) +
                            " is not available on this CPU");
  }
  if (n > 0 && (p == nullptr || m == nullptr || v == nullptr || g == nullptr)) {
    return InvalidArgumentError("AdamTrafficPass: null pointer");
  }
  const TrafficKernelFn kernel = KernelsFor(isa).traffic;
  InArena(arena, [&] { ParallelTiles(n, [&](size_t b, size_t e) { kernel(p, m, v, g, out16, b, e); }); });
  return OkStatus();
}

}  // namespace strata::optim
