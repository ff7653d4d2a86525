// Internal: the two yardsticks of `strata bench adam` and bench/adam_bench.cc.
#pragma once

#include <oneapi/tbb/task_arena.h>

#include <cstddef>

#include "strata/adam.h"
#include "strata/status.h"

namespace strata::optim {

// The naive baseline: the textbook AdamW loop (fp32 grads, bf16 copy through
// FloatToBf16), one thread per tile like AdamStep, in a file compiled with gcc's
// default -fmath-errno (src/CMakeLists.txt), i.e. what a plain build of a plain loop
// gets: gcc 12 does not vectorize it because sqrtf must be able to set errno.
void AdamStepNaive(const AdamParams& params, float* master, float* m, float* v, const float* grad, Bf16* out,
                   size_t n, tbb::task_arena* arena);

// The memory-bandwidth limit pass: Adam's exact memory traffic (read p, m, v and fp32
// g; write p, m, v in place and, when out16 is not null, a 16-bit value per element)
// with no arithmetic, over the same tiles and threads as AdamStep, with the widest
// vectors `isa` has. Values are unchanged (the 16-bit array gets arbitrary bits).
Status AdamTrafficPass(CpuIsa isa, float* p, float* m, float* v, const float* g, void* out16, size_t n,
                       tbb::task_arena* arena);

}  // namespace strata::optim
