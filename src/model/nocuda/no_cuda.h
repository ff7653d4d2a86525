// What every call of a build without CUDA returns (internal to src/model/nocuda).
#pragma once

#include <string>

#include "strata/status.h"

namespace strata::model::cuda {

// Unavailable, naming `what` and how to get CUDA.
inline Status NoCuda(const char* what) {
  return UnavailableError(std::string("model: ") + what +
                          " needs CUDA, but strata was built without it (rebuild with STRATA_CUDA=ON on a "
                          "machine with the CUDA toolkit)");
}

}  // namespace strata::model::cuda
