#include "zero/safetensors_init.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>
#include <utility>
#include <vector>

#include "strata/half.h"
#include "zero/safetensors_header.h"

namespace strata::zero {
namespace {

constexpr int64_t kReadElems = 1 << 20;  // values read and converted at a time
constexpr size_t kMaxListed = 24;        // mismatches named one by one

using Entries = std::map<std::string, SafetensorsEntry>;

// The file, open for pread, closed when the last copy of the init goes.
struct File {
  int fd = -1;
  std::string path;
  uint64_t data_start = 0;
  ~File() {
    if (fd >= 0) ::close(fd);
  }
};

// Every way the file does not fit the model, one per line (the first kMaxListed, then a
// count of the rest).
std::string Mismatches(const Entries& file, const ModelDecl& model) {
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
    if (SafetensorsDTypeBytes(it->second.dtype) == 0)
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
  STRATA_ASSIGN_OR_RETURN(SafetensorsHeader header, ReadSafetensorsHeader(file->fd, path));
  file->data_start = header.data_start;
  Entries entries;
  for (SafetensorsEntry& e : header.tensors) entries[e.name] = std::move(e);
  const std::string mismatches = Mismatches(entries, model);
  if (!mismatches.empty()) {
    return InvalidArgumentError(path + " does not fit the model (" + std::to_string(model.tensors.size()) +
                                " tensors; names and shapes must match):" + mismatches);
  }
  std::vector<SafetensorsEntry> by_id;
  for (const TensorDecl& d : model.tensors) by_id.push_back(entries.at(d.name));
  SafetensorsInit out;
  out.tensors = static_cast<int>(entries.size());
  out.read_error = std::make_shared<Status>();
  out.init = [file, by_id = std::move(by_id), error = out.read_error](TensorId t, int64_t begin,
                                                                      int64_t count, float* values) {
    const SafetensorsEntry& e = by_id[t];
    const int size = SafetensorsDTypeBytes(e.dtype);
    std::vector<uint8_t> raw(static_cast<size_t>(std::min(count, kReadElems)) * size);
    for (int64_t at = 0; at < count; at += kReadElems) {
      const int64_t n = std::min(count - at, kReadElems);
      Status st = PreadExactly(file->fd, file->path, file->data_start + e.begin + (begin + at) * size,
                               raw.data(), n * size);
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
