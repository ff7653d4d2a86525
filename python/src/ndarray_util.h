// Helpers for the DLPack views (nanobind ndarrays) the bindings receive.
#pragma once

#include <nanobind/ndarray.h>

#include <cstddef>
#include <cstdint>

namespace strata::py {

// Row-major contiguous (nanobind's strides count elements); a dimension of size 1 may
// have any stride, and an empty array is contiguous, as in torch's is_contiguous().
template <typename... Args>
bool IsContiguous(const nanobind::ndarray<Args...>& a) {
  if (a.size() == 0) return true;
  int64_t expect = 1;
  for (size_t d = a.ndim(); d-- > 0;) {
    if (a.shape(d) != 1 && a.stride(d) != expect) return false;
    expect *= static_cast<int64_t>(a.shape(d));
  }
  return true;
}

}  // namespace strata::py
