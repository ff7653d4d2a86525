// What a host collective is, kept as numbers and turned into words only into a fixed
// buffer. The watch board needs the words on every collective; building them with
// ostringstream and FormatBytes at every issue cost ~5 us of a 1 MiB all-gather over 2
// ranks (0.6 us with the caches warm: after a 1 MiB transfer they are not).
#pragma once

#include <array>
#include <cstddef>
#include <string_view>

#include "strata/dtype.h"

namespace strata::comm {

struct OpDesc {
  std::string_view kind;  // a string literal ("AllGather"); empty: the op has a label instead
  DType dtype = DType::kF32;
  size_t count = 0;  // elements of the full buffer
  int root = -1;     // broadcast root; -1: none
};

using OpTextBuffer = std::array<char, 96>;

// "AllGather f32 x262144 (1.00 MiB)", "Broadcast f32 x262144 (1.00 MiB) root 0": the
// size as FormatBytes writes it. No allocation; truncated to the buffer.
std::string_view FormatOp(const OpDesc& desc, OpTextBuffer& buf);

}  // namespace strata::comm
