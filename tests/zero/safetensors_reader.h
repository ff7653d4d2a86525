// A strict safetensors reader for the export tests (checkpoint_export_test, its MPI twin
// and ckpt_cli_test): the whole file in memory, checked as the safetensors library checks
// it on load, so a file it accepts loads there too: an 8-byte little-endian header length,
// a JSON header padded to 8 bytes, and tensors whose data_offsets tile the data exactly
// (no gap, no overlap, nothing after the last), each sized dtype x shape.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "strata/half.h"
#include "strata/status.h"

namespace strata::testing {

struct SafeTensor {
  std::string dtype;  // "F32", "BF16", "F16"
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
};

struct SafetensorsFile {
  std::map<std::string, SafeTensor> tensors;
  nlohmann::json metadata;  // "__metadata__", or null
};

inline Result<SafetensorsFile> ReadSafetensors(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFoundError(path + ": cannot open");
  const std::vector<uint8_t> file((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (file.size() < 8) return CorruptionError(path + ": shorter than the header length");
  uint64_t n = 0;
  for (int b = 7; b >= 0; --b) n = (n << 8) | file[b];
  if (8 + n > file.size() || (8 + n) % 8 != 0) return CorruptionError(path + ": bad header length");
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(file.begin() + 8, file.begin() + 8 + static_cast<int64_t>(n));
  } catch (const std::exception& e) {
    return CorruptionError(path + ": header: " + e.what());
  }
  SafetensorsFile out;
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (const auto& [name, t] : header.items()) {
    if (name == "__metadata__") {
      for (const auto& [k, v] : t.items()) {
        if (!v.is_string()) return CorruptionError(path + ": metadata " + k + " is not a string");
      }
      out.metadata = t;
      continue;
    }
    SafeTensor st{t.at("dtype").get<std::string>(), t.at("shape").get<std::vector<int64_t>>(), {}};
    const uint64_t begin = t.at("data_offsets").at(0), end = t.at("data_offsets").at(1);
    uint64_t numel = 1;
    for (int64_t d : st.shape) numel *= static_cast<uint64_t>(d);
    const uint64_t esize = st.dtype == "F32" ? 4 : st.dtype == "BF16" || st.dtype == "F16" ? 2 : 0;
    if (esize == 0 || end < begin || end - begin != numel * esize)
      return CorruptionError(path + ": tensor " + name + " has a bad dtype or size");
    if (8 + n + end > file.size()) return CorruptionError(path + ": tensor " + name + " lies past the end");
    st.bytes.assign(file.begin() + static_cast<int64_t>(8 + n + begin),
                    file.begin() + static_cast<int64_t>(8 + n + end));
    ranges.emplace_back(begin, end);
    out.tensors.emplace(name, std::move(st));
  }
  std::sort(ranges.begin(), ranges.end());
  uint64_t at = 0;
  for (const auto& [begin, end] : ranges) {
    if (begin != at)
      return CorruptionError(path + ": data_offsets leave a gap or overlap at " + std::to_string(at));
    at = end;
  }
  if (8 + n + at != file.size()) return CorruptionError(path + ": bytes after the last tensor");
  return out;
}

// The 16-bit encodings of `v` rounded to `dtype` as the export rounds (half.h), as bytes.
inline std::vector<uint8_t> Expected16(const std::vector<float>& v, bool bf16) {
  std::vector<uint8_t> out(v.size() * 2);
  for (size_t i = 0; i < v.size(); ++i) {
    const uint16_t bits = bf16 ? FloatToBf16(v[i]).bits : FloatToFp16(v[i]).bits;
    std::memcpy(out.data() + 2 * i, &bits, 2);
  }
  return out;
}

inline std::vector<uint8_t> Bytes(const std::vector<float>& v) {
  std::vector<uint8_t> out(v.size() * 4);
  std::memcpy(out.data(), v.data(), out.size());
  return out;
}

}  // namespace strata::testing
