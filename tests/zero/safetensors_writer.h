// Safetensors files written by hand for the tests of what reads their headers
// (safetensors_plan_model_test, plan_cli_test): tensors of zeros stored in the order
// given, the JSON's keys in nlohmann's (sorted by name), and raw files for the broken
// ones.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace strata::testing {

struct HeaderTensor {
  std::string name, dtype;
  std::vector<int64_t> shape;
};

inline uint64_t DTypeSize(const std::string& dtype) { return dtype == "F32" ? 4 : dtype == "I64" ? 8 : 2; }

// 8-byte little-endian length, `header` as given, then `data_bytes` zero bytes.
inline void WriteRawSafetensors(const std::string& path, const std::string& header, uint64_t data_bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  for (int b = 0; b < 8; ++b) out.put(static_cast<char>((header.size() >> (8 * b)) & 0xff));
  out << header;
  out << std::string(data_bytes, '\0');
}

// The header of `tensors` stored one after another in that order, with `metadata` as
// "__metadata__"; `*data_bytes` is what their data takes.
inline std::string SafetensorsHeaderText(const std::vector<HeaderTensor>& tensors, uint64_t* data_bytes) {
  nlohmann::json header = {{"__metadata__", {{"format", "pt"}}}};
  uint64_t at = 0;
  for (const HeaderTensor& t : tensors) {
    uint64_t bytes = DTypeSize(t.dtype);
    for (int64_t d : t.shape) bytes *= static_cast<uint64_t>(d);
    header[t.name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {at, at + bytes}}};
    at += bytes;
  }
  *data_bytes = at;
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  return text;
}

// A whole file of zeros; with `sparse`, the data is a hole the size of the tensors
// (ftruncate), so a header of gigabytes takes no disk.
inline void WriteSafetensors(const std::string& path, const std::vector<HeaderTensor>& tensors,
                             bool sparse = false) {
  uint64_t data = 0;
  const std::string header = SafetensorsHeaderText(tensors, &data);
  WriteRawSafetensors(path, header, sparse ? 0 : data);
  if (sparse && ::truncate(path.c_str(), static_cast<off_t>(8 + header.size() + data)) != 0) {
    std::ofstream(path, std::ios::trunc);  // an empty file: the test's checks then fail
  }
}

}  // namespace strata::testing
