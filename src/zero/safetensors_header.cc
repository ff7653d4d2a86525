#include "zero/safetensors_header.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>
#include <tuple>
#include <utility>

namespace strata::zero {
namespace {

constexpr uint64_t kMaxHeaderBytes = 100ull << 20;  // the safetensors library's own limit

// One tensor's entry of the header, checked against the data section's `data_bytes`.
Result<SafetensorsEntry> ParseEntry(const std::string& path, const std::string& name, const nlohmann::json& v,
                                    uint64_t data_bytes) {
  auto bad = [&](const std::string& what) {
    return CorruptionError(path + ": not a safetensors file: tensor \"" + name + "\" " + what);
  };
  SafetensorsEntry e;
  e.name = name;
  try {
    e.dtype = v.at("dtype").get<std::string>();
    e.shape = v.at("shape").get<std::vector<int64_t>>();
    const nlohmann::json& offsets = v.at("data_offsets");
    if (!offsets.is_array() || offsets.size() != 2) return bad("has data_offsets that are not two numbers");
    e.begin = offsets.at(0).get<uint64_t>();
    e.end = offsets.at(1).get<uint64_t>();
  } catch (const std::exception& ex) {
    return bad(std::string("has no valid dtype, shape or data_offsets (") + ex.what() + ")");
  }
  uint64_t numel = 1;
  for (int64_t d : e.shape) {
    if (d < 0) return bad("has a negative dimension in its shape " + ShapeText(e.shape));
    numel *= static_cast<uint64_t>(d);
  }
  if (e.begin > e.end || e.end > data_bytes)
    return bad("lies outside the data (" + std::to_string(data_bytes) + " bytes)");
  const int size = SafetensorsDTypeBytes(e.dtype);
  if (size > 0 && e.end - e.begin != numel * size) {
    return bad("holds " + std::to_string(e.end - e.begin) + " bytes, its " + e.dtype + " " +
               ShapeText(e.shape) + " needs " + std::to_string(numel * size));
  }
  return e;
}

}  // namespace

int SafetensorsDTypeBytes(const std::string& dtype) {
  if (dtype == "F32") return 4;
  if (dtype == "BF16" || dtype == "F16") return 2;
  return 0;
}

std::string ShapeText(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

Status PreadExactly(int fd, const std::string& path, uint64_t offset, void* dst, uint64_t n) {
  auto* out = static_cast<uint8_t*>(dst);
  while (n > 0) {
    const ssize_t got = ::pread(fd, out, n, static_cast<off_t>(offset));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) {
      return IoError(path + ": reading " + std::to_string(n) + " bytes at offset " + std::to_string(offset) +
                     ": " + (got < 0 ? std::strerror(errno) : "unexpected end of file"));
    }
    out += got;
    offset += got;
    n -= got;
  }
  return OkStatus();
}

Result<SafetensorsHeader> ReadSafetensorsHeader(int fd, const std::string& path) {
  auto bad = [&](const std::string& what) {
    return CorruptionError(path + ": not a safetensors file: " + what);
  };
  struct stat st {};
  if (::fstat(fd, &st) != 0) return IoError(path + ": " + std::strerror(errno));
  if (S_ISDIR(st.st_mode)) return IoError(path + ": is a directory, not a safetensors file");
  SafetensorsHeader h;
  h.path = path;
  h.file_bytes = static_cast<uint64_t>(st.st_size);
  if (h.file_bytes < 8) {
    return bad("it has " + std::to_string(h.file_bytes) + " bytes, shorter than its 8-byte header length");
  }
  uint8_t len[8];
  STRATA_RETURN_IF_ERROR(PreadExactly(fd, path, 0, len, 8));
  uint64_t n = 0;
  for (int b = 7; b >= 0; --b) n = (n << 8) | len[b];
  if (n > h.file_bytes - 8 || n > kMaxHeaderBytes) {
    return bad("its header length (" + std::to_string(n) + " bytes) runs past the end of the file (" +
               std::to_string(h.file_bytes) + " bytes)");
  }
  std::string text(n, '\0');
  STRATA_RETURN_IF_ERROR(PreadExactly(fd, path, 8, text.data(), n));
  h.data_start = 8 + n;
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(text);
  } catch (const std::exception& e) {
    return bad(std::string("its header is not JSON (") + e.what() + ")");
  }
  if (!header.is_object()) return bad("its header is not a JSON object");
  const uint64_t data_bytes = h.file_bytes - h.data_start;
  for (const auto& [name, v] : header.items()) {
    if (name == "__metadata__") continue;
    STRATA_ASSIGN_OR_RETURN(SafetensorsEntry e, ParseEntry(path, name, v, data_bytes));
    h.tensors.push_back(std::move(e));
  }
  std::sort(h.tensors.begin(), h.tensors.end(), [](const SafetensorsEntry& a, const SafetensorsEntry& b) {
    return std::tie(a.begin, a.end, a.name) < std::tie(b.begin, b.end, b.name);
  });
  for (size_t i = 1; i < h.tensors.size(); ++i) {
    const SafetensorsEntry &a = h.tensors[i - 1], &b = h.tensors[i];
    if (b.begin < a.end) {
      return bad("the data of tensors \"" + a.name + "\" [" + std::to_string(a.begin) + ", " +
                 std::to_string(a.end) + ") and \"" + b.name + "\" [" + std::to_string(b.begin) + ", " +
                 std::to_string(b.end) + ") overlap");
    }
  }
  return h;
}

Result<SafetensorsHeader> ReadSafetensorsHeader(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const std::string why = std::strerror(errno);
    return errno == ENOENT ? NotFoundError(path + ": " + why) : IoError(path + ": " + why);
  }
  Result<SafetensorsHeader> h = ReadSafetensorsHeader(fd, path);
  ::close(fd);
  return h;
}

}  // namespace strata::zero
