// ExportSafetensors (checkpoint.h): a checkpoint's master weights as one safetensors file,
// assembled from the ranks' master files through a fixed buffer.
//
// Why rank by rank: each master file is then read front to back once, so its whole-file
// checksum is checked as well as every chunk's, and only one file's stream buffers exist
// at a time. The header fixes every tensor's place in the output before any data is
// read, so the pieces of a tensor that lie in different ranks' shards are written at
// their places with pwrite, in whatever order the ranks come.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "strata/checkpoint.h"
#include "strata/half.h"
#include "strata/io.h"
#include "zero/checkpoint_dir.h"
#include "zero/checkpoint_manifest.h"
#include "zero/checkpoint_stream.h"

namespace strata {
namespace {

constexpr int kMasterKind = 0;              // ckpt::kKindNames[0]
constexpr int64_t kConvertElems = 1 << 20;  // elements per write: 2 MiB of 16-bit output

const char* SafetensorsDType(DType d) {
  switch (d) {
    case DType::kF32: return "F32";
    case DType::kBf16: return "BF16";
    case DType::kFp16: return "F16";
  }
  return "F32";
}

// A tensor of the output: its layout entry and where its bytes start in the file.
struct OutTensor {
  const ckpt::TensorEntry* entry = nullptr;
  uint64_t file_offset = 0;  // of its first element
  int64_t start = 0;         // where it starts in the chunk listing it (negative inside a run)
};

struct ExportPlan {
  std::string head;                              // length prefix, header JSON, padding
  std::vector<std::vector<OutTensor>> by_chunk;  // each chunk's tensors, by offset
  uint64_t data_bytes = 0;
};

// What the export relies on beyond ParseManifest's checks: names a safetensors header
// can hold once each, shapes that match the element counts, tensors that do not overlap
// (the layout never makes them; a copy must not write one tensor's bytes twice), and
// shards that cover every chunk.
Status CheckLayout(const ckpt::Manifest& m, const std::vector<size_t>& order, const std::string& where) {
  auto bad = [&](const std::string& what) { return CorruptionError(where + ": " + what); };
  const CheckpointInfo& i = m.info;
  if (i.shard_elems * i.state_ranks < i.chunk_elems)
    return bad("the state files' shards do not cover a chunk");
  std::set<std::string> names;
  for (const ckpt::TensorEntry& t : m.tensors) {
    int64_t n = 1;
    for (int64_t d : t.shape) n *= d;
    if (n != t.numel) return bad("tensor \"" + t.name + "\" has a shape that does not hold its numel");
    if (t.name == "__metadata__" || !names.insert(t.name).second)
      return bad("tensor name \"" + t.name + "\" appears twice or is reserved");
  }
  for (size_t k = 1; k < order.size(); ++k) {
    const ckpt::TensorEntry& a = m.tensors[order[k - 1]];
    const ckpt::TensorEntry& b = m.tensors[order[k]];
    const int64_t ce = i.chunk_elems;
    if (a.chunk * ce + a.offset + a.numel > b.chunk * ce + b.offset)
      return bad("tensors \"" + a.name + "\" and \"" + b.name + "\" overlap");
  }
  return OkStatus();
}

Result<ExportPlan> PlanExport(const ckpt::Manifest& m, const std::string& dir, DType dtype) {
  std::vector<size_t> order(m.tensors.size());
  for (size_t t = 0; t < order.size(); ++t) order[t] = t;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    const ckpt::TensorEntry &x = m.tensors[a], &y = m.tensors[b];
    return x.chunk != y.chunk ? x.chunk < y.chunk : x.offset < y.offset;
  });
  STRATA_RETURN_IF_ERROR(CheckLayout(m, order, dir + "/" + ckpt::kManifestName));

  // Ordered: "__metadata__" first and the tensors in the order of their data, as the
  // safetensors library writes them (readers accept any order).
  nlohmann::ordered_json header;
  header["__metadata__"] = {{"format", "pt"},
                            {"source", dir},
                            {"step_calls", std::to_string(m.info.step_calls)},
                            {"optimizer_steps", std::to_string(m.info.optimizer_steps)},
                            {"meta", m.info.meta_json}};
  ExportPlan plan;
  plan.by_chunk.resize(m.info.num_chunks);
  for (size_t t : order) {
    const ckpt::TensorEntry& e = m.tensors[t];
    const uint64_t bytes = static_cast<uint64_t>(e.numel) * DTypeSize(dtype);
    header[e.name] = {{"dtype", SafetensorsDType(dtype)},
                      {"shape", e.shape},
                      {"data_offsets", {plan.data_bytes, plan.data_bytes + bytes}}};
    const int64_t ce = m.info.chunk_elems;
    const int last = e.chunk + static_cast<int>((e.offset + std::max<int64_t>(e.numel, 1) - 1) / ce);
    for (int c = e.chunk; c <= last; ++c)
      plan.by_chunk[c].push_back({&e, plan.data_bytes, (e.chunk - c) * ce + e.offset});
    plan.data_bytes += bytes;
  }
  std::string json = header.dump();
  json.append((8 - json.size() % 8) % 8, ' ');  // the data starts 8-byte aligned
  plan.head.resize(8);
  for (int b = 0; b < 8; ++b) plan.head[b] = static_cast<char>((json.size() >> (8 * b)) & 0xff);
  plan.head += json;
  for (auto& chunk : plan.by_chunk) {
    for (OutTensor& t : chunk) t.file_offset += plan.head.size();
  }
  return plan;
}

// The output while it is written: out_path + ".tmp", removed unless Commit renamed it.
class TmpOutput {
 public:
  explicit TmpOutput(std::string out_path) : out_(std::move(out_path)), tmp_(out_ + ".tmp") {}
  ~TmpOutput() {
    if (fd_ >= 0) ::close(fd_);
    if (!committed_) ::unlink(tmp_.c_str());  // may not exist: nothing to report
  }
  TmpOutput(const TmpOutput&) = delete;
  TmpOutput& operator=(const TmpOutput&) = delete;

  Status Open() {
    fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd_ < 0)
      return ErrnoError(errno, "export: create " + tmp_ + " (is its directory there and writable?)");
    return OkStatus();
  }

  Status Write(const void* data, uint64_t n, uint64_t offset) {
    const char* p = static_cast<const char*>(data);
    while (n > 0) {
      const ssize_t w = ::pwrite(fd_, p, n, static_cast<off_t>(offset));
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) return ErrnoError(w < 0 ? errno : EIO, "export: writing " + tmp_);
      p += w;
      n -= static_cast<uint64_t>(w);
      offset += static_cast<uint64_t>(w);
    }
    return OkStatus();
  }

  // Makes the output durable under its name: fsync, close, rename, fsync the directory.
  Status Commit() {
    if (::fsync(fd_) != 0) return ErrnoError(errno, "export: fsync " + tmp_);
    const int rc = ::close(fd_);
    fd_ = -1;
    if (rc != 0) return ErrnoError(errno, "export: close " + tmp_);
    if (::rename(tmp_.c_str(), out_.c_str()) != 0)
      return ErrnoError(errno, "export: rename " + tmp_ + " to " + out_);
    committed_ = true;
    const std::string parent = std::filesystem::path(out_).parent_path().string();
    return ckpt::SyncDir(parent.empty() ? "." : parent);
  }

 private:
  std::string out_, tmp_;
  int fd_ = -1;
  bool committed_ = false;
};

// Writes `n` fp32 elements at `src` (the reader's view) as `dtype` at `offset`.
Status WriteElements(const uint8_t* src, int64_t n, DType dtype, std::vector<uint16_t>& convert,
                     uint64_t offset, TmpOutput& out) {
  if (dtype == DType::kF32) return out.Write(src, n * 4, offset);
  for (int64_t i = 0; i < n; ++i) {
    float f;
    std::memcpy(&f, src + 4 * i, 4);
    convert[i] = dtype == DType::kBf16 ? FloatToBf16(f).bits : FloatToFp16(f).bits;
  }
  return out.Write(convert.data(), n * 2, offset);
}

// Copies chunk elements [lo, hi) (a rank's shard, the reader's current section) into
// the tensors of the chunk that lie there; what lies between them is skipped.
Status CopyShard(ckpt::FileReader& r, const std::vector<OutTensor>& tensors, int64_t lo, int64_t hi,
                 DType dtype, std::vector<uint16_t>& convert, TmpOutput& out) {
  int64_t pos = lo;
  for (const OutTensor& t : tensors) {
    const int64_t begin = std::max(lo, t.start);
    const int64_t end = std::min(hi, t.start + t.entry->numel);
    if (begin >= end) continue;
    STRATA_RETURN_IF_ERROR(r.Skip((begin - pos) * 4));
    uint64_t at = t.file_offset + (begin - t.start) * DTypeSize(dtype);
    for (int64_t left = end - begin; left > 0;) {
      STRATA_ASSIGN_OR_RETURN(std::span<const uint8_t> v, r.Next(std::min(left, kConvertElems) * 4));
      // The reader's buffers and sections are 4 KiB aligned: a view never splits a float.
      if (v.empty() || v.size() % 4 != 0)
        return InternalError("export: a read of " + r.path() + " split a float");
      const int64_t n = static_cast<int64_t>(v.size() / 4);
      STRATA_RETURN_IF_ERROR(WriteElements(v.data(), n, dtype, convert, at, out));
      at += n * DTypeSize(dtype);
      left -= n;
    }
    pos = end;
  }
  return r.Skip((hi - pos) * 4);
}

// Exports rank `rank`'s master file: every chunk's shard, each checked against the
// manifest's checksum before the next is read, then the whole file's.
Status ExportRankFile(IoEngine& io, const std::string& dir, const ckpt::Manifest& m, const ExportPlan& plan,
                      int rank, DType dtype, std::vector<uint16_t>& convert, TmpOutput& out,
                      const std::function<void(const std::string&)>& report) {
  const CheckpointInfo& i = m.info;
  const CheckpointFileInfo* f = ckpt::FindFile(i, rank, kMasterKind);  // ParseManifest checked it is there
  const std::string path = dir + "/" + f->path;
  auto opened = ckpt::FileReader::Open(io, nullptr, path, f->bytes);
  if (!opened.ok() && opened.status().code() == StatusCode::kNotFound) {
    return NotFoundError("checkpoint " + dir + ": rank " + std::to_string(rank) + "'s master file " + path +
                         " is missing; nothing was exported");
  }
  if (!opened.ok()) return opened.status();
  ckpt::FileReader& r = **opened;
  const int64_t lo = rank * i.shard_elems, hi = lo + i.shard_elems;
  for (int c = 0; c < i.num_chunks; ++c) {
    STRATA_RETURN_IF_ERROR(r.BeginSection(c * i.chunk_bytes, i.shard_elems * 4));
    STRATA_RETURN_IF_ERROR(CopyShard(r, plan.by_chunk[c], lo, hi, dtype, convert, out));
    STRATA_ASSIGN_OR_RETURN(uint64_t sum, r.EndSection());
    if (sum != f->chunk_xxh3[c]) {
      return CorruptionError(
          "checkpoint file " + path + ": chunk " + std::to_string(c) + " (bytes " +
          std::to_string(c * i.chunk_bytes) + " to " + std::to_string((c + 1) * i.chunk_bytes) +
          ") has checksum " + ChecksumHex(sum) + ", the manifest says " + ChecksumHex(f->chunk_xxh3[c]) +
          "; nothing was exported (`strata ckpt verify " + dir + "` lists every bad chunk)");
    }
  }
  // The padding between chunks is in the file's checksum only, as VerifyCheckpoint checks it.
  if (r.contiguous() && r.read_end() == f->bytes && r.file_xxh3() != f->xxh3) {
    return CorruptionError("checkpoint file " + path + " has checksum " + ChecksumHex(r.file_xxh3()) +
                           ", the manifest says " + ChecksumHex(f->xxh3) +
                           " (its padding between chunks differs); nothing was exported");
  }
  if (report) {
    report(f->path + ": " + std::to_string(i.num_chunks) + " chunks checked and exported (xxh3 " +
           ChecksumHex(f->xxh3) + ")");
  }
  return OkStatus();
}

}  // namespace

Status ExportSafetensors(const std::string& dir, const std::string& out_path, DType dtype,
                         const std::function<void(const std::string& line)>& report) {
  if (out_path.empty()) return InvalidArgumentError("export: no output path given");
  STRATA_ASSIGN_OR_RETURN(ckpt::Manifest m, ckpt::ReadManifest(dir));
  STRATA_ASSIGN_OR_RETURN(ExportPlan plan, PlanExport(m, dir, dtype));
  STRATA_ASSIGN_OR_RETURN(auto io, IoEngine::Create(IoEngineOptions{}));
  TmpOutput out(out_path);
  STRATA_RETURN_IF_ERROR(out.Open());
  STRATA_RETURN_IF_ERROR(out.Write(plan.head.data(), plan.head.size(), 0));
  std::vector<uint16_t> convert(dtype == DType::kF32 ? 0 : kConvertElems);
  for (int r = 0; r < m.info.state_ranks; ++r) {
    STRATA_RETURN_IF_ERROR(ExportRankFile(*io, dir, m, plan, r, dtype, convert, out, report));
  }
  return out.Commit();
}

}  // namespace strata
