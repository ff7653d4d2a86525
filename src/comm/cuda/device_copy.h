// A synchronous copy between any host and device memory (cudaMemcpyDefault), for tests
// and benchmarks of the device communicator that must not include CUDA headers.
// Built only with CUDA (STRATA_HAVE_CUDA).
#pragma once

#include <cstddef>

#include "strata/status.h"

namespace strata::comm {

Status DeviceCopy(void* dst, const void* src, size_t bytes);

}  // namespace strata::comm
