// Shared by the comm tests: deterministic per-rank data in each dtype and the
// expectation the contract promises (fp32 sum in rank order, one rounding).
#pragma once

#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "comm/dtype.h"
#include "strata/comm.h"

namespace strata::comm::test {

// A value with some mantissa bits, so that bf16/fp16 rounding matters.
inline float Value(int rank, size_t i, uint32_t seed) {
  uint64_t h = (static_cast<uint64_t>(rank) + 1) * 0x9E3779B97F4A7C15ull ^ (i + 1) * 0xC2B2AE3D27D4EB4Full ^ seed;
  h ^= h >> 29;
  h *= 0xBF58476D1CE4E5B9ull;
  h ^= h >> 32;
  return static_cast<float>(static_cast<int64_t>(h % 200001) - 100000) / 4099.0f;
}

inline float Load(DType d, const std::vector<uint8_t>& buf, size_t i) {
  switch (d) {
    case DType::kF32: {
      float f;
      std::memcpy(&f, buf.data() + 4 * i, 4);
      return f;
    }
    case DType::kBf16: {
      uint16_t h;
      std::memcpy(&h, buf.data() + 2 * i, 2);
      return Bf16ToF32(h);
    }
    case DType::kFp16: {
      uint16_t h;
      std::memcpy(&h, buf.data() + 2 * i, 2);
      return F16ToF32(h);
    }
  }
  return 0;
}

inline void Store(DType d, std::vector<uint8_t>& buf, size_t i, float v) {
  switch (d) {
    case DType::kF32: std::memcpy(buf.data() + 4 * i, &v, 4); break;
    case DType::kBf16: {
      uint16_t h = F32ToBf16(v);
      std::memcpy(buf.data() + 2 * i, &h, 2);
      break;
    }
    case DType::kFp16: {
      uint16_t h = F32ToF16(v);
      std::memcpy(buf.data() + 2 * i, &h, 2);
      break;
    }
  }
}

// Rank `rank`'s input of n elements.
inline std::vector<uint8_t> Input(DType d, int rank, size_t n, uint32_t seed) {
  std::vector<uint8_t> b(n * DTypeSize(d));
  for (size_t i = 0; i < n; ++i) Store(d, b, i, Value(rank, i, seed));
  return b;
}

// Element i of the reduction over ranks [0, size) of their inputs, as the contract says.
inline std::vector<uint8_t> Reduced(DType d, int size, size_t n, uint32_t seed, ReduceOp op,
                                    const std::vector<int>& ranks = {}) {
  std::vector<int> rs = ranks;
  if (rs.empty()) {
    for (int r = 0; r < size; ++r) rs.push_back(r);
  }
  std::vector<std::vector<uint8_t>> in;
  for (int r : rs) in.push_back(Input(d, r, n, seed));
  std::vector<uint8_t> out(n * DTypeSize(d));
  for (size_t i = 0; i < n; ++i) {
    float acc = Load(d, in[0], i);
    for (size_t k = 1; k < in.size(); ++k) acc += Load(d, in[k], i);
    if (op == ReduceOp::kAvg) acc /= static_cast<float>(rs.size());
    Store(d, out, i, acc);
  }
  return out;
}

}  // namespace strata::comm::test
