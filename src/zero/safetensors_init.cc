#include "zero/safetensors_init.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>
#include <nlohmann/json.hpp>
#include <utility>
#include <vector>

#include "strata/half.h"

namespace strata::zero {
namespace {

constexpr int64_t kReadElems = 1 << 20;  // values read and converted at a time
constexpr size_t kMaxListed = 24;        // mismatches named one by one

struct Entry {
  std::string dtype;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;  // in the data section
};

int DTypeBytes(const std::string& dtype) {
  if (dtype == "F32") return 4;
  if (dtype == "BF16" || dtype == "F16") return 2;
  return 0;
}

std::string ShapeText(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// The file, open for pread, closed when the last copy of the init goes.
struct File {
  int fd = -1;
  std::string path;
  uint64_t data_start = 0;
  ~File() {
    if (fd >= 0) ::close(fd);
  }
  Status ReadAt(uint64_t offset, void* dst, uint64_t n) const {
    auto* out = static_cast<uint8_t*>(dst);
    while (n > 0) {
      const ssize_t got = ::pread(fd, out, n, static_cast<off_t>(offset));
      if (got < 0 && errno == EINTR) continue;
      if (got <= 0) {
        return IoError(path + ": reading " + std::to_string(n) + " bytes at offset " +
                       std::to_string(offset) + ": " +
                       (got < 0 ? std::strerror(errno) : "unexpected end of file"));
      }
      out += got;
      offset += got;
      n -= got;
    }
    return OkStatus();
  }
};

Result<std::map<std::string, Entry>> ReadHeader(File& f, uint64_t file_bytes) {
  auto bad = [&](const std::string& what) {
    return CorruptionError(f.path + ": not a safetensors file: " + what);
  };
  uint8_t len[8];
  if (file_bytes < 8) return bad("shorter than its 8-byte header length");
  STRATA_RETURN_IF_ERROR(f.ReadAt(0, len, 8));
  uint64_t n = 0;
  for (int b = 7; b >= 0; --b) n = (n << 8) | len[b];
  if (n > file_bytes - 8 || n > (100ull << 20)) return bad("its header length runs past the file");
  std::string text(n, '\0');
  STRATA_RETURN_IF_ERROR(f.ReadAt(8, text.data(), n));
  f.data_start = 8 + n;
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(text);
  } catch (const std::exception& e) {
    return bad(std::string("its header is not JSON (") + e.what() + ")");
  }
  if (!header.is_object()) return bad("its header is not a JSON object");
  std::map<std::string, Entry> out;
  const uint64_t data_bytes = file_bytes - f.data_start;
  for (const auto& [name, v] : header.items()) {
    if (name == "__metadata__") continue;
    Entry e;
    try {
      e.dtype = v.at("dtype").get<std::string>();
      e.shape = v.at("shape").get<std::vector<int64_t>>();
      e.begin = v.at("data_offsets").at(0).get<uint64_t>();
      e.end = v.at("data_offsets").at(1).get<uint64_t>();
    } catch (const std::exception& ex) {
      return bad("tensor \"" + name + "\": " + ex.what());
    }
    uint64_t numel = 1;
    for (int64_t d : e.shape) numel *= d < 0 ? 0 : static_cast<uint64_t>(d);
    const int size = DTypeBytes(e.dtype);
    if (e.begin > e.end || e.end > data_bytes)
      return bad("tensor \"" + name + "\" lies outside the data (" + std::to_string(data_bytes) + " bytes)");
    if (size > 0 && e.end - e.begin != numel * size)
      return bad("tensor \"" + name + "\" holds " + std::to_string(e.end - e.begin) + " bytes, its " +
                 e.dtype + " " + ShapeText(e.shape) + " needs " + std::to_string(numel * size));
    out[name] = e;
  }
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (const auto& [name, e] : out) ranges.push_back({e.begin, e.end});
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i) {
    if (ranges[i].first < ranges[i - 1].second) return bad("two tensors' data overlap");
  }
  return out;
}

// Every way the file does not fit the model, one per line (the first kMaxListed, then a
// count of the rest).
std::string Mismatches(const std::map<std::string, Entry>& file, const ModelDecl& model) {
  std::vector<std::string> lines;
  std::map<std::string, int> wanted;
  for (size_t t = 0; t < model.tensors.size(); ++t) wanted[model.tensors[t].name] = static_cast<int>(t);
  for (const TensorDecl& d : model.tensors) {
    auto it = file.find(d.name);
    if (it == file.end()) {
      lines.push_back("\"" + d.name + "\" " + ShapeText(d.shape) + ": not in the file");
      continue;
    }
    if (it->second.shape != d.shape)
      lines.push_back("\"" + d.name + "\": " + ShapeText(it->second.shape) + " in the file, the model's is " +
                      ShapeText(d.shape));
    if (DTypeBytes(it->second.dtype) == 0)
      lines.push_back("\"" + d.name + "\": dtype " + it->second.dtype + " (F32, BF16 and F16 are read)");
  }
  for (const auto& [name, e] : file) {
    if (!wanted.count(name))
      lines.push_back("\"" + name + "\" " + ShapeText(e.shape) + ": not a tensor of the model");
  }
  std::string out;
  for (size_t i = 0; i < lines.size() && i < kMaxListed; ++i) out += "\n  " + lines[i];
  if (lines.size() > kMaxListed) out += "\n  ... and " + std::to_string(lines.size() - kMaxListed) + " more";
  return out;
}

void Convert(const std::string& dtype, const uint8_t* src, int64_t n, float* out) {
  if (dtype == "F32") {
    std::memcpy(out, src, n * 4);
    return;
  }
  for (int64_t i = 0; i < n; ++i) {
    uint16_t bits;
    std::memcpy(&bits, src + 2 * i, 2);
    out[i] = dtype == "BF16" ? Bf16ToFloat(Bf16{bits}) : Fp16ToFloat(Fp16{bits});
  }
}

}  // namespace

Result<SafetensorsInit> OpenSafetensorsInit(const std::string& path, const ModelDecl& model) {
  auto file = std::make_shared<File>();
  file->path = path;
  file->fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (file->fd < 0) {
    const std::string why = std::strerror(errno);
    return errno == ENOENT ? NotFoundError(path + ": " + why) : IoError(path + ": " + why);
  }
  struct stat st {};
  if (::fstat(file->fd, &st) != 0) return IoError(path + ": " + std::strerror(errno));
  STRATA_ASSIGN_OR_RETURN(auto entries, ReadHeader(*file, static_cast<uint64_t>(st.st_size)));
  const std::string mismatches = Mismatches(entries, model);
  if (!mismatches.empty()) {
    return InvalidArgumentError(path + " does not fit the model (" + std::to_string(model.tensors.size()) +
                                " tensors; names and shapes must match):" + mismatches);
  }
  std::vector<Entry> by_id;
  for (const TensorDecl& d : model.tensors) by_id.push_back(entries.at(d.name));
  SafetensorsInit out;
  out.tensors = static_cast<int>(entries.size());
  out.read_error = std::make_shared<Status>();
  out.init = [file, by_id = std::move(by_id), error = out.read_error](TensorId t, int64_t begin,
                                                                      int64_t count, float* values) {
    const Entry& e = by_id[t];
    const int size = DTypeBytes(e.dtype);
    std::vector<uint8_t> raw(static_cast<size_t>(std::min(count, kReadElems)) * size);
    for (int64_t at = 0; at < count; at += kReadElems) {
      const int64_t n = std::min(count - at, kReadElems);
      Status st = file->ReadAt(file->data_start + e.begin + (begin + at) * size, raw.data(), n * size);
      if (!st.ok()) {
        if (error->ok()) *error = st;
        std::fill(values + at, values + count, 0.0f);
        return;
      }
      Convert(e.dtype, raw.data(), n, values + at);
    }
  };
  return out;
}

}  // namespace strata::zero
