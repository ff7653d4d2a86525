#include "strata/units.h"

#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <string>

namespace strata {
namespace {

std::string Lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

// Splits "1.5GiB" into the number 1.5 and suffix "GiB".
Result<double> ParseNumber(std::string_view text, std::string_view* suffix, std::string_view what) {
  size_t i = 0;
  while (i < text.size() && std::isspace(static_cast<unsigned char>(text[i]))) ++i;
  text.remove_prefix(i);
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back()))) text.remove_suffix(1);
  if (text.empty()) return InvalidArgumentError("empty " + std::string(what));
  double value = 0;
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || ptr == text.data()) {
    return InvalidArgumentError("cannot parse " + std::string(what) + " \"" + std::string(text) +
                                "\": expected a number with an optional unit, e.g. 64MiB, 1.5GB, 2e9");
  }
  if (!std::isfinite(value) || value < 0) {
    return InvalidArgumentError(std::string(what) + " \"" + std::string(text) +
                                "\" must be a finite number >= 0");
  }
  *suffix = std::string_view(ptr, text.data() + text.size() - ptr);
  while (!suffix->empty() && std::isspace(static_cast<unsigned char>(suffix->front())))
    suffix->remove_prefix(1);
  return value;
}

Result<uint64_t> ToWhole(double v, std::string_view text, std::string_view what) {
  if (v >= 1.8446744073709552e19) {
    return InvalidArgumentError(std::string(what) + " \"" + std::string(text) + "\" is too large");
  }
  double r = std::round(v);
  if (std::fabs(r - v) > 1e-6 * std::max(1.0, v)) {
    return InvalidArgumentError(std::string(what) + " \"" + std::string(text) + "\" is not a whole number");
  }
  return static_cast<uint64_t>(r);
}

}  // namespace

Result<uint64_t> ParseBytes(std::string_view text) {
  std::string_view suffix;
  STRATA_ASSIGN_OR_RETURN(double v, ParseNumber(text, &suffix, "byte size"));
  std::string s = Lower(suffix);
  double mult = 1;
  if (s.empty() || s == "b")
    mult = 1;
  else if (s == "k" || s == "kib")
    mult = 1024.0;
  else if (s == "m" || s == "mib")
    mult = 1024.0 * 1024;
  else if (s == "g" || s == "gib")
    mult = 1024.0 * 1024 * 1024;
  else if (s == "t" || s == "tib")
    mult = 1024.0 * 1024 * 1024 * 1024;
  else if (s == "kb")
    mult = 1e3;
  else if (s == "mb")
    mult = 1e6;
  else if (s == "gb")
    mult = 1e9;
  else if (s == "tb")
    mult = 1e12;
  else {
    return InvalidArgumentError("byte size \"" + std::string(text) + "\": unknown unit \"" +
                                std::string(suffix) + "\"; use B, KiB, MiB, GiB, TiB, kB, MB, GB or TB");
  }
  return ToWhole(v * mult, text, "byte size");
}

Result<uint64_t> ParseCount(std::string_view text) {
  std::string_view suffix;
  STRATA_ASSIGN_OR_RETURN(double v, ParseNumber(text, &suffix, "count"));
  std::string s = Lower(suffix);
  double mult = 1;
  if (s.empty())
    mult = 1;
  else if (s == "k")
    mult = 1e3;
  else if (s == "m")
    mult = 1e6;
  else if (s == "g" || s == "b")
    mult = 1e9;
  else if (s == "t")
    mult = 1e12;
  else {
    return InvalidArgumentError("count \"" + std::string(text) + "\": unknown suffix \"" +
                                std::string(suffix) + "\"; use K, M, G (or B) or an exponent like 2e9");
  }
  return ToWhole(v * mult, text, "count");
}

std::string FormatBytes(uint64_t bytes) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024.0 && u < 5) {
    v /= 1024.0;
    ++u;
  }
  char buf[64];
  if (u == 0)
    std::snprintf(buf, sizeof(buf), "%llu B", static_cast<unsigned long long>(bytes));
  else
    std::snprintf(buf, sizeof(buf), v < 10 ? "%.2f %s" : (v < 100 ? "%.1f %s" : "%.0f %s"), v, kUnits[u]);
  return buf;
}

std::string FormatRate(double bps) {
  static constexpr const char* kUnits[] = {"B/s", "kB/s", "MB/s", "GB/s", "TB/s"};
  int u = 0;
  while (bps >= 1000.0 && u < 4) {
    bps /= 1000.0;
    ++u;
  }
  char buf[64];
  std::snprintf(buf, sizeof(buf), bps < 10 ? "%.2f %s" : (bps < 100 ? "%.1f %s" : "%.0f %s"), bps, kUnits[u]);
  return buf;
}

std::string FormatSeconds(double s) {
  char buf[64];
  if (s >= 1.0)
    std::snprintf(buf, sizeof(buf), "%.2f s", s);
  else if (s >= 1e-3)
    std::snprintf(buf, sizeof(buf), "%.2f ms", s * 1e3);
  else if (s >= 1e-6)
    std::snprintf(buf, sizeof(buf), "%.1f us", s * 1e6);
  else
    std::snprintf(buf, sizeof(buf), "%.0f ns", s * 1e9);
  return buf;
}

std::string FormatDouble(const char* printf_format, double value) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), printf_format, value);
  return buf;
}

std::string FormatCount(double n) {
  char buf[64];
  if (n >= 1e12)
    std::snprintf(buf, sizeof(buf), "%.2fT", n / 1e12);
  else if (n >= 1e9)
    std::snprintf(buf, sizeof(buf), "%.2fG", n / 1e9);
  else if (n >= 1e6)
    std::snprintf(buf, sizeof(buf), "%.1fM", n / 1e6);
  else if (n >= 1e3)
    std::snprintf(buf, sizeof(buf), "%.1fK", n / 1e3);
  else
    std::snprintf(buf, sizeof(buf), "%.0f", n);
  return buf;
}

}  // namespace strata
