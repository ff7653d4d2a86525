// A safetensors file's header: an 8-byte little-endian length, then that many bytes of
// JSON naming each tensor's dtype, shape and data_offsets (relative to the data, which
// follows the header). Read and checked without reading any tensor's data, so a file of
// any size opens in the time of its header. `strata train --init-from` reads values
// through it; `strata plan --model-file` plans the model it describes.
//
// Any thread; the functions hold no state.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "strata/status.h"

namespace strata::zero {

struct SafetensorsEntry {
  std::string name;
  std::string dtype;  // as written: "F32", "BF16", "I64", ...
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;  // in the data section
};

struct SafetensorsHeader {
  std::string path;
  uint64_t file_bytes = 0;
  uint64_t data_start = 0;  // 8 + the header's length
  // In the order of their data offsets (the order the file stores them; the JSON's key
  // order means nothing). "__metadata__" is not a tensor and is left out.
  std::vector<SafetensorsEntry> tensors;
};

// Bytes per element of the dtypes strata reads (F32 4, BF16 and F16 2); 0 for any other.
int SafetensorsDTypeBytes(const std::string& dtype);

// "[2, 3]".
std::string ShapeText(const std::vector<int64_t>& shape);

// Reads exactly `n` bytes at `offset` of `fd` (EINTR and short reads retried). IoError
// naming `path`, the offset and the cause (an end of file among them).
Status PreadExactly(int fd, const std::string& path, uint64_t offset, void* dst, uint64_t n);

// The header of the open file `fd` (named `path` in errors). Corruption, naming the file
// and what is wrong ("not a safetensors file: ..."): shorter than the 8-byte length, a
// length past the end of the file (or over 100 MiB), JSON that does not parse or is not
// an object, a tensor without a string dtype, a shape of integers or two data_offsets, a
// negative dimension, data_offsets reversed or past the data, two tensors' data
// overlapping, and an F32, BF16 or F16 tensor whose bytes are not dtype x shape. Other
// dtypes are kept as written (their size unchecked): what to make of them is the
// caller's. IoError for a failed read.
Result<SafetensorsHeader> ReadSafetensorsHeader(int fd, const std::string& path);

// The same for a path, opened and closed here. NotFound when it does not exist, IoError
// when it cannot be opened or is a directory; both name the path.
Result<SafetensorsHeader> ReadSafetensorsHeader(const std::string& path);

}  // namespace strata::zero
