// Element conversions and the fp32-accumulating reduction used by the host backend.
// Internal to src/comm (tests include it to build their expectations).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "strata/comm.h"

namespace strata::comm {

inline float Bf16ToF32(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Round to nearest even; NaN stays NaN (quiet), infinities stay infinite.
inline uint16_t F32ToBf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

// IEEE binary16, scalar reference conversions (round to nearest even, subnormals kept).
float F16ToF32(uint16_t h);
uint16_t F32ToF16(float f);

// out[i] = round(in[0][i] + in[1][i] + ... + in[n_in-1][i]), summed in fp32 in the
// order given, then divided by `divisor` (in fp32) when divisor > 1, then rounded once
// to `dtype`. `out` may be the same pointer as one of the inputs (not a partial overlap).
void ReduceInto(DType dtype, int n_in, const void* const* in, void* out, size_t count, int divisor);

}  // namespace strata::comm
