// Element types of parameter, gradient and collective buffers, shared by every layer.
// Pure values; any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace strata {

enum class DType : uint8_t { kF32, kBf16, kFp16 };

constexpr size_t DTypeSize(DType t) { return t == DType::kF32 ? 4 : 2; }
// "f32", "bf16", "fp16".
constexpr std::string_view DTypeName(DType t) {
  return t == DType::kF32 ? "f32" : t == DType::kBf16 ? "bf16" : "fp16";
}

}  // namespace strata
