#include "comm/op_text.h"

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <cstring>

namespace strata::comm {

std::string_view FormatOp(const OpDesc& desc, OpTextBuffer& buf) {
  char* p = buf.data();
  char* const end = buf.data() + buf.size();
  auto put = [&](std::string_view s) {
    size_t n = std::min(s.size(), static_cast<size_t>(end - p));
    std::memcpy(p, s.data(), n);
    p += n;
  };
  // On overflow to_chars returns `end` as ptr: the text is cut there.
  auto put_int = [&](auto v) { p = std::to_chars(p, end, v).ptr; };
  put(desc.kind);
  put(" ");
  put(DTypeName(desc.dtype));
  put(" x");
  put_int(desc.count);
  put(" (");
  // The units and rounding of FormatBytes (units.cc), whose text the reports used before.
  static constexpr std::string_view kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  const uint64_t bytes = desc.count * DTypeSize(desc.dtype);
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024.0 && u < 5) {
    v /= 1024.0;
    ++u;
  }
  if (u == 0) {
    put_int(bytes);
  } else {
    p = std::to_chars(p, end, v, std::chars_format::fixed, v < 10 ? 2 : (v < 100 ? 1 : 0)).ptr;
  }
  put(" ");
  put(kUnits[u]);
  put(")");
  if (desc.root >= 0) {
    put(" root ");
    put_int(desc.root);
  }
  return {buf.data(), static_cast<size_t>(p - buf.data())};
}

}  // namespace strata::comm
