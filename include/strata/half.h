// 16-bit floating point storage types (bf16 and IEEE fp16) and their conversions.
//
// Contract:
//  - Bf16 and Fp16 are storage types: 16 bits, trivially copyable, no arithmetic.
//    Convert to float, compute, convert back.
//  - FloatToBf16 / FloatToFp16 round to nearest, ties to even (the correctly rounded
//    result), including subnormal results and overflow to infinity, independent of the
//    FPU's rounding mode and of FTZ/DAZ. NaN stays NaN (quiet, sign and top payload bits
//    kept): bf16 = (bits >> 16) | 0x0040, fp16 = sign | 0x7e00 | (mantissa >> 13).
//    These are the exact results of VCVTNEPS2BF16 for normal inputs and of
//    VCVTPS2PH (round-to-nearest) for all inputs, so SIMD paths can be compared bit for bit.
//  - Bf16ToFloat / Fp16ToFloat are exact.
//  - Header-only pure functions (usable from any layer); any thread; nvcc host code too.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "strata/dtype.h"

namespace strata {

struct Bf16 {
  uint16_t bits = 0;
  friend constexpr bool operator==(Bf16, Bf16) = default;
};
struct Fp16 {
  uint16_t bits = 0;
  friend constexpr bool operator==(Fp16, Fp16) = default;
};
static_assert(sizeof(Bf16) == 2 && sizeof(Fp16) == 2);

// Element types (DType, DTypeSize, DTypeName) are in dtype.h, shared with comm.

constexpr Bf16 FloatToBf16(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return Bf16{static_cast<uint16_t>((x >> 16) | 0x0040u)};
  // Adding 0x7fff plus the lowest kept bit rounds to nearest even; a carry into the
  // exponent (and up to infinity) is the correct result.
  return Bf16{static_cast<uint16_t>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16)};
}

constexpr float Bf16ToFloat(Bf16 h) { return std::bit_cast<float>(static_cast<uint32_t>(h.bits) << 16); }

constexpr Fp16 FloatToFp16(float f) {
  const uint32_t bits = std::bit_cast<uint32_t>(f);
  const uint32_t sign = (bits >> 16) & 0x8000u;
  const uint32_t x = bits & 0x7fffffffu;
  if (x >= 0x7f800000u) {  // inf or NaN
    return Fp16{
        static_cast<uint16_t>(x == 0x7f800000u ? sign | 0x7c00u : sign | 0x7e00u | ((x >> 13) & 0x3ffu))};
  }
  if (x >= 0x477ff000u) return Fp16{static_cast<uint16_t>(sign | 0x7c00u)};  // >= 65520: rounds to inf
  if (x >= 0x38800000u) {  // normal fp16 result (>= 2^-14); rebias the exponent by 127-15
    return Fp16{static_cast<uint16_t>(sign | ((x - 0x38000000u + 0xfffu + ((x >> 13) & 1u)) >> 13))};
  }
  const uint32_t e = x >> 23;
  if (e < 102) return Fp16{static_cast<uint16_t>(sign)};  // below 2^-25: rounds to zero
  // Subnormal result: value / 2^-24 rounded to nearest even; 0x400 (the smallest
  // normal) is the right encoding when it rounds up.
  const uint32_t m = (x & 0x7fffffu) | 0x800000u;
  const uint32_t shift = 126 - e;  // 14..24
  uint32_t r = m >> shift;
  const uint32_t rem = m & ((1u << shift) - 1);
  const uint32_t half = 1u << (shift - 1);
  if (rem > half || (rem == half && (r & 1u))) ++r;
  return Fp16{static_cast<uint16_t>(sign | r)};
}

constexpr float Fp16ToFloat(Fp16 h) {
  const uint32_t sign = static_cast<uint32_t>(h.bits & 0x8000u) << 16;
  const uint32_t e = (h.bits >> 10) & 0x1fu;
  uint32_t m = h.bits & 0x3ffu;
  if (e == 0x1f) return std::bit_cast<float>(sign | 0x7f800000u | (m << 13));
  if (e != 0) return std::bit_cast<float>(sign | ((e + 112) << 23) | (m << 13));
  if (m == 0) return std::bit_cast<float>(sign);
  // Subnormal: normalize the mantissa.
  uint32_t exp = 113;
  while ((m & 0x400u) == 0) {
    m <<= 1;
    --exp;
  }
  return std::bit_cast<float>(sign | (exp << 23) | ((m & 0x3ffu) << 13));
}

}  // namespace strata
