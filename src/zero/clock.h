// Monotonic nanoseconds, for the engine's busy-time counters.
#pragma once

#include <chrono>
#include <cstdint>

namespace strata {

inline int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace strata
