#include "zero/checkpoint_reshard.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

namespace strata::ckpt {
namespace {

constexpr uint64_t kWindowBytes = 4ull << 20;

}  // namespace

Result<std::unique_ptr<ReshardSource>> ReshardSource::Open(IoEngine& io, HostArena* arena,
                                                           const std::string& dir, const Manifest& m,
                                                           const zero::Layout& layout, int64_t opt_offset,
                                                           int64_t opt_elems) {
  const CheckpointInfo& i = m.info;
  const std::string where = dir + "/" + kManifestName;
  if (i.shard_elems * i.state_ranks < i.chunk_elems)
    return CorruptionError(where + ": the state files' shards do not cover a chunk");
  if (m.tensors.size() != layout.tensors.size())
    return InvalidArgumentError(where + ": another model (" + std::to_string(m.tensors.size()) + " tensors)");
  std::unique_ptr<ReshardSource> s(new ReshardSource());
  s->io_ = &io;
  s->arena_ = arena;
  s->dir_ = dir;
  s->m_ = &m;
  s->layout_ = &layout;
  s->opt_offset_ = opt_offset;
  s->opt_elems_ = opt_elems;
  for (int k = 0; k < kStateKinds; ++k) {
    void* p = std::aligned_alloc(kIoAlign, kWindowBytes);
    if (p == nullptr) return ResourceExhaustedError("checkpoint: no memory for a 4 MiB read window");
    s->window_[k].data = static_cast<uint8_t*>(p);
    s->files_[k].resize(i.state_ranks);
  }
  for (int c = 0; c < layout.num_chunks; ++c) {
    s->ForEachRun(c, opt_offset, opt_offset + opt_elems, [&](int64_t, int64_t, int rank, uint64_t byte) {
      s->sections_.insert({rank, static_cast<int>(byte / i.chunk_bytes)});
    });
  }
  return s;
}

ReshardSource::~ReshardSource() {
  for (Window& w : window_) std::free(w.data);
}

template <typename F>
void ReshardSource::ForEachRun(int chunk, int64_t lo, int64_t hi, F&& f) const {
  const CheckpointInfo& i = m_->info;
  for (TensorId id : layout_->chunk_tensors[chunk]) {  // ascending offsets
    const int64_t here = layout_->StartIn(id, chunk);  // negative inside a run
    const int64_t a = std::max(lo, here), b = std::min(hi, here + layout_->tensors[id].numel);
    if (a >= b) continue;
    const TensorEntry& saved = m_->tensors[id];
    // In the saved layout's element positions, chunk after chunk (a saved tensor may
    // run over several chunks too).
    int64_t from = saved.chunk * i.chunk_elems + saved.offset + (a - here);
    for (int64_t at = a; at < b;) {
      const int64_t saved_chunk = from / i.chunk_elems, in_chunk = from % i.chunk_elems;
      const int rank = i.state_ranks == 1 ? 0 : static_cast<int>(in_chunk / i.shard_elems);
      const int64_t in_shard = in_chunk - rank * i.shard_elems;
      const int64_t n = std::min({b - at, i.shard_elems - in_shard, i.chunk_elems - in_chunk});
      f(at - lo, n, rank, saved_chunk * i.chunk_bytes + static_cast<uint64_t>(in_shard) * 4);
      at += n;
      from += n;
    }
  }
}

std::string ReshardSource::Path(int kind, int rank) const {
  return dir_ + "/" + FindFile(m_->info, rank, kind)->path;  // ParseManifest found every one
}

Status ReshardSource::Verify() {
  const CheckpointInfo& i = m_->info;
  for (int k = 0; k < kStateKinds; ++k) {
    int open_rank = -1;
    std::unique_ptr<FileReader> r;
    for (const auto& [rank, chunk] : sections_) {
      const CheckpointFileInfo& rec = *FindFile(i, rank, k);
      if (rank != open_rank) {
        auto opened = FileReader::Open(*io_, arena_, Path(k, rank), rec.bytes);
        if (!opened.ok() && opened.status().code() == StatusCode::kNotFound) {
          return NotFoundError("checkpoint " + dir_ + ": rank " + std::to_string(rank) + "'s " +
                               kKindNames[k] + " file " + Path(k, rank) +
                               " is missing, and this rank's shards take values from it");
        }
        if (!opened.ok()) return opened.status();
        r = std::move(*opened);
        open_rank = rank;
      }
      STRATA_RETURN_IF_ERROR(r->BeginSection(chunk * i.chunk_bytes, i.shard_elems * 4));
      STRATA_RETURN_IF_ERROR(r->Skip(i.shard_elems * 4));
      STRATA_ASSIGN_OR_RETURN(uint64_t sum, r->EndSection());
      STRATA_RETURN_IF_ERROR(CheckChunkChecksum(r->path(), rec, chunk, i.chunk_bytes, sum));
    }
  }
  verified_ = true;
  return OkStatus();
}

Result<OpenFile*> ReshardSource::File(int kind, int rank) {
  std::unique_ptr<OpenFile>& f = files_[kind][rank];
  if (!f) {
    STRATA_ASSIGN_OR_RETURN(f, OpenForStream(*io_, Path(kind, rank), /*write=*/false));
  }
  return f.get();
}

Status ReshardSource::Copy(int kind, int rank, uint64_t byte, uint64_t bytes, uint8_t* dst) {
  Window& w = window_[kind];
  while (bytes > 0) {
    if (w.rank != rank || byte < w.begin || byte >= w.end) {
      STRATA_ASSIGN_OR_RETURN(OpenFile * f, File(kind, rank));
      // Files are whole 4 KiB sections, so an aligned window ends inside or at the end.
      const uint64_t file_bytes = FindFile(m_->info, rank, kind)->bytes;
      w.rank = -1;
      w.begin = byte / kIoAlign * kIoAlign;
      const uint64_t length = std::min(kWindowBytes, file_bytes - w.begin);
      STRATA_ASSIGN_OR_RETURN(IoHandle h, io_->Read(f->id, w.begin, length, w.data));
      STRATA_RETURN_IF_ERROR(h.Wait().WithContext("checkpoint: reading " + f->path));
      w.rank = rank;
      w.end = w.begin + length;
    }
    const uint64_t n = std::min(bytes, w.end - byte);
    std::memcpy(dst, w.data + (byte - w.begin), n);
    dst += n;
    byte += n;
    bytes -= n;
  }
  return OkStatus();
}

Status ReshardSource::Read(int kind, int chunk, int64_t begin, int64_t n, float* dst) {
  if (!verified_) return InternalError("checkpoint: ReshardSource::Read before Verify");
  std::memset(dst, 0, n * sizeof(float));
  Status st;
  const int64_t lo = opt_offset_ + begin;
  ForEachRun(chunk, lo, lo + n, [&](int64_t at, int64_t count, int rank, uint64_t byte) {
    if (st.ok()) st = Copy(kind, rank, byte, count * 4, reinterpret_cast<uint8_t*>(dst + at));
  });
  return st;
}

}  // namespace strata::ckpt
