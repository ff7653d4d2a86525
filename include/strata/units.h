// Byte sizes, counts and rates: parsing what users type and printing what they read.
//
//   ParseBytes("64MiB") == 64 << 20     ParseBytes("1.5GB") == 1'500'000'000
//   ParseBytes("2e9")   == 2'000'000'000  ParseBytes("4096") == 4096
// Binary suffixes (KiB, MiB, GiB, TiB; also K, M, G, T, case-insensitive) are powers
// of 1024; decimal ones (kB, KB, MB, GB, TB) powers of 1000. Fractions are allowed when
// the result is a whole number of bytes. Pure functions; thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "strata/status.h"

namespace strata {

// Parses a byte size; negative, fractional-byte, overflowing or malformed input is
// InvalidArgument naming the text.
Result<uint64_t> ParseBytes(std::string_view text);
// Parses a count such as "2e9", "256M" (decimal: M = 1e6, G = 1e9, K = 1e3), "1000".
Result<uint64_t> ParseCount(std::string_view text);

// "64.0 MiB", "1.50 GiB", "512 B".
std::string FormatBytes(uint64_t bytes);
// "12.3 GB/s" (decimal, as storage and network rates are quoted).
std::string FormatRate(double bytes_per_second);
// "1.23 ms", "45.6 us", "2.00 s".
std::string FormatSeconds(double seconds);
// One double through a printf format with one conversion ("%.3f"): for report lines.
std::string FormatDouble(const char* printf_format, double value);
// "20.1M", "1.50G", "295" (decimal, as ParseCount reads them).
std::string FormatCount(double n);

constexpr uint64_t KiB = 1024;
constexpr uint64_t MiB = 1024 * KiB;
constexpr uint64_t GiB = 1024 * MiB;

}  // namespace strata
