// cudaError_t -> Status, for the CUDA adapter files only (includes cuda_runtime.h).
#pragma once

#include <cuda_runtime.h>

#include <string_view>

#include "strata/status.h"

namespace strata::tiering {

// OK for cudaSuccess; otherwise "<what>: cudaErrorX (text)" with a code by kind:
// allocation failures ResourceExhausted, bad arguments InvalidArgument, a missing
// driver or device Unavailable, everything else Internal.
Status CudaCheck(cudaError_t err, std::string_view what);

}  // namespace strata::tiering
