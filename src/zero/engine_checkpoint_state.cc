// Moving a rank's optimizer state between its tier and the checkpoint's state files,
// chunk by chunk, through the streams' fixed buffers (checkpoint_stream.h):
//  - device and pinned host tiers: a chunk's master, m and v are copied straight between
//    the tier and the stream buffers (device reads and writes by the device ops);
//  - NVMe: each piece's committed slot is read into the engine's own staging sets (two
//    reads in flight when two sets are free) and split into the three files; a load
//    assembles each piece from the three files in one staging set and writes it back to
//    the chunk's committed slot. No chunk is ever whole in host memory. A chunk kept
//    resident in pinned memory (partial residency) goes as on the host tier.
// A load into another layout (checkpoint_reshard.h) writes the same way, taking each
// piece's values from a ReshardSource instead of the rank's own three files.
// Why not copy_file_range from the swap: a slot holds one piece's master | m | v
// together, striped over the swap paths, and its checksums live in the store's memory,
// so the checkpoint's per-kind files cannot be cut out of it by the kernel; the bytes
// pass through memory once either way on a single disk.
#include <algorithm>
#include <cstring>
#include <deque>
#include <vector>

#include "zero/engine_checkpoint.h"

namespace strata::ckpt {
namespace {

using Writers = std::array<std::unique_ptr<FileWriter>, kStateKinds>;

// A chunk's master | m | v in device or pinned host memory, kind by kind.
Status SaveChunkFromMemory(Engine::Impl& s, int chunk, Writers& w) {
  zero::DeviceOps& ops = s.OpsOn(s.OptTierOf(chunk));
  const uint64_t bytes = s.opt_elems * 4;
  for (int k = 0; k < kStateKinds; ++k) {
    const uint8_t* src = reinterpret_cast<const uint8_t*>(s.opt[chunk].state + k * s.opt_elems);
    for (uint64_t done = 0; done < bytes;) {
      STRATA_ASSIGN_OR_RETURN(std::span<uint8_t> room, w[k]->Space(bytes - done));
      STRATA_RETURN_IF_ERROR(ops.ReadToHost(zero::OpsLane::kTraining, room.data(), src + done, room.size()));
      w[k]->Commit(room.size());
      done += room.size();
    }
  }
  return OkStatus();
}

// The NVMe tier's committed state of every chunk, piece by piece, with up to two piece
// reads in flight (the engine's staging sets; after Flush none is busy).
class NvmeSaver {
 public:
  NvmeSaver(Engine::Impl& s, Writers& w) : s_(s), w_(w) {}
  ~NvmeSaver() {
    for (Read& r : reads_) {
      r.handle.Wait().IgnoreError();
      free_.push_back(r.set);
    }
    for (float* set : free_) s_.opt_staging.Give(set);
  }

  Status Run() {
    STRATA_ASSIGN_OR_RETURN(float* first, s_.TakeOptStaging());
    free_.push_back(first);
    if (void* second = s_.opt_staging.TryTake()) free_.push_back(static_cast<float*>(second));
    for (int c = 0; c < s_.layout.num_chunks; ++c) STRATA_RETURN_IF_ERROR(s_.SettleCommit(c));
    for (int c = 0; c < s_.layout.num_chunks; ++c) {
      for (auto& writer : w_) writer->BeginSection();
      if (s_.Resident(c)) {
        STRATA_RETURN_IF_ERROR(SaveChunkFromMemory(s_, c, w_));
      } else {
        for (int p = 0; p < s_.pieces; ++p) STRATA_RETURN_IF_ERROR(SavePiece(c, p));
      }
      for (int k = 0; k < kStateKinds; ++k) {
        STRATA_ASSIGN_OR_RETURN(uint64_t sum, w_[k]->EndSection());
        sums[k].push_back(sum);
      }
    }
    return OkStatus();
  }

  std::array<std::vector<uint64_t>, kStateKinds> sums;

 private:
  struct Read {
    int key = 0;
    float* set = nullptr;
    IoHandle handle;
  };

  // Issues reads of the next live pieces into free sets.
  Status ReadAhead() {
    const int total = s_.layout.num_chunks * s_.pieces;
    while (!free_.empty() && next_ < total) {
      const int c = next_ / s_.pieces, p = next_ % s_.pieces;
      if (s_.PieceLive(c, p) && !s_.Resident(c)) {
        const Engine::Impl::OptChunk& o = s_.opt[c];
        auto rd = s_.opt_store->Read(o.slot[o.current][p], free_.back(), s_.PieceBytes(p));
        if (!rd.ok())
          return rd.status().WithContext("checkpoint: reading the optimizer state of chunk " +
                                         std::to_string(c));
        reads_.push_back({next_, free_.back(), *rd});
        free_.pop_back();
      }
      ++next_;
    }
    return OkStatus();
  }

  Status SavePiece(int c, int p) {
    const uint64_t bytes = s_.PieceElems(p) * 4;
    if (!s_.PieceLive(c, p)) {
      // Wholly padding: never stepped, so zero (the engine never wrote its slot).
      for (auto& writer : w_) STRATA_RETURN_IF_ERROR(writer->AppendZeros(bytes));
      return OkStatus();
    }
    STRATA_RETURN_IF_ERROR(ReadAhead());
    Read r = reads_.front();
    reads_.pop_front();
    free_.push_back(r.set);  // back to the free list whatever happens below
    STRATA_RETURN_IF_ERROR(r.handle.Wait().WithContext("checkpoint: reading the optimizer state of chunk " +
                                                       std::to_string(c) + " piece " + std::to_string(p)));
    for (int k = 0; k < kStateKinds; ++k) {
      STRATA_RETURN_IF_ERROR(w_[k]->Append(r.set + k * s_.PieceElems(p), bytes));
    }
    return OkStatus();
  }

  Engine::Impl& s_;
  Writers& w_;
  std::vector<float*> free_;
  std::deque<Read> reads_;
  int next_ = 0;  // the next piece (chunk * pieces + piece) to read
};

Status RestoreChunkToMemory(Engine::Impl& s, int chunk, StateReaders& f) {
  zero::DeviceOps& ops = s.OpsOn(s.OptTierOf(chunk));
  const uint64_t bytes = s.opt_elems * 4;
  for (int k = 0; k < kStateKinds; ++k) {
    uint8_t* dst = reinterpret_cast<uint8_t*>(s.opt[chunk].state + k * s.opt_elems);
    for (uint64_t done = 0; done < bytes;) {
      STRATA_ASSIGN_OR_RETURN(std::span<const uint8_t> v, f.reader[k]->Next(bytes - done));
      STRATA_RETURN_IF_ERROR(ops.WriteFromHost(zero::OpsLane::kTraining, dst + done, v.data(), v.size()));
      done += v.size();
    }
  }
  return OkStatus();
}

// A piece of `chunk` assembled in `set` (master | m | v, n values each) goes to the
// chunk's committed slot, as the optimizer writes it: with the master as a readable
// prefix when gathers read parameters from it.
Status WritePiece(Engine::Impl& s, int chunk, int p, float* set) {
  const int64_t n = s.PieceElems(p);
  std::memset(set + 3 * n, 0, s.PieceBytes(p) - 3 * n * 4);
  const Engine::Impl::OptChunk& o = s.opt[chunk];
  auto wr = s.opt_store->Write(o.slot[o.current][p], set, s.PieceBytes(p), s.param_from_master ? n * 4 : 0);
  return (wr.ok() ? wr->Wait() : wr.status())
      .WithContext("checkpoint: writing the optimizer state of chunk " + std::to_string(chunk) + " to NVMe");
}

// Each live piece assembled from the three files in one staging set.
Status RestoreChunkToNvme(Engine::Impl& s, int chunk, StateReaders& f, float* set) {
  for (int p = 0; p < s.pieces; ++p) {
    const int64_t n = s.PieceElems(p);
    if (!s.PieceLive(chunk, p)) {
      for (auto& r : f.reader) STRATA_RETURN_IF_ERROR(r->Skip(n * 4));
      continue;
    }
    for (int k = 0; k < kStateKinds; ++k) STRATA_RETURN_IF_ERROR(f.reader[k]->ReadInto(set + k * n, n * 4));
    STRATA_RETURN_IF_ERROR(WritePiece(s, chunk, p, set));
  }
  s.SyncParamSource(chunk);
  return OkStatus();
}

// A resharded chunk: its values come from wherever the saving layout put them.
Status ReshardChunk(Engine::Impl& s, int chunk, ReshardSource& src, float* set, std::vector<float>& bounce) {
  if (s.OptTierOf(chunk) == ZeroTier::kNvme) {
    for (int p = 0; p < s.pieces; ++p) {
      if (!s.PieceLive(chunk, p)) continue;  // wholly padding: never read, so never written
      const int64_t n = s.PieceElems(p);
      for (int k = 0; k < kStateKinds; ++k)
        STRATA_RETURN_IF_ERROR(src.Read(k, chunk, p * s.piece_elems, n, set + k * n));
      STRATA_RETURN_IF_ERROR(WritePiece(s, chunk, p, set));
    }
    s.SyncParamSource(chunk);
    return OkStatus();
  }
  zero::DeviceOps& ops = s.OpsOn(s.OptTierOf(chunk));
  for (int k = 0; k < kStateKinds; ++k) {
    float* dst = s.opt[chunk].state + k * s.opt_elems;
    for (int64_t at = 0; at < s.opt_elems; at += bounce.size()) {
      const int64_t n = std::min<int64_t>(bounce.size(), s.opt_elems - at);
      STRATA_RETURN_IF_ERROR(src.Read(k, chunk, at, n, bounce.data()));
      STRATA_RETURN_IF_ERROR(ops.WriteFromHost(zero::OpsLane::kTraining, dst + at, bounce.data(), n * 4));
    }
  }
  return OkStatus();
}

}  // namespace

uint64_t ChunkBytes(const Engine::Impl& s) { return AlignUp(s.opt_elems * 4); }

Status WriteStateFiles(Engine::Impl& s, IoEngine& io, const std::string& tmp,
                       std::vector<CheckpointFileInfo>* files) {
  Writers w;
  for (int k = 0; k < kStateKinds; ++k) {
    STRATA_ASSIGN_OR_RETURN(w[k], FileWriter::Create(io, s.arena, tmp + "/" + StateFileName(k, s.rank)));
  }
  std::array<std::vector<uint64_t>, kStateKinds> sums;
  if (s.opt_tier == ZeroTier::kNvme) {
    NvmeSaver saver(s, w);
    STRATA_RETURN_IF_ERROR(saver.Run());
    sums = saver.sums;
  } else {
    for (int c = 0; c < s.layout.num_chunks; ++c) {
      for (auto& writer : w) writer->BeginSection();
      STRATA_RETURN_IF_ERROR(SaveChunkFromMemory(s, c, w));
      for (int k = 0; k < kStateKinds; ++k) {
        STRATA_ASSIGN_OR_RETURN(uint64_t sum, w[k]->EndSection());
        sums[k].push_back(sum);
      }
    }
  }
  for (int k = 0; k < kStateKinds; ++k) {
    STRATA_RETURN_IF_ERROR(w[k]->Finish());
    files->push_back({StateFileName(k, s.rank), s.rank, kKindNames[k], w[k]->bytes(), w[k]->xxh3(), sums[k]});
  }
  return OkStatus();
}

Result<StateReaders> OpenStateFiles(Engine::Impl& s, IoEngine& io, const std::string& dir, const Manifest& m,
                                    int source_rank) {
  StateReaders f;
  for (int k = 0; k < kStateKinds; ++k) {
    f.record[k] = FindFile(m.info, source_rank, k);  // present: ParseManifest checked
    const std::string path = dir + "/" + f.record[k]->path;
    auto r = FileReader::Open(io, s.arena, path, f.record[k]->bytes);
    if (!r.ok() && r.status().code() == StatusCode::kNotFound) {
      return NotFoundError("checkpoint " + dir + ": rank " + std::to_string(source_rank) + "'s " +
                           kKindNames[k] + " file " + path + " is missing (" + r.status().ToString() + ")");
    }
    if (!r.ok()) return r.status();
    f.reader[k] = std::move(*r);
  }
  return f;
}

Status RestoreState(Engine::Impl& s, StateReaders& f) {
  const uint64_t chunk_bytes = ChunkBytes(s);
  float* set = nullptr;
  if (s.opt_tier == ZeroTier::kNvme) {
    STRATA_ASSIGN_OR_RETURN(set, s.TakeOptStaging());
  }
  Status st;
  for (int c = 0; st.ok() && c < s.layout.num_chunks; ++c) {
    for (int k = 0; st.ok() && k < kStateKinds; ++k)
      st = f.reader[k]->BeginSection(c * chunk_bytes, s.opt_elems * 4);
    if (st.ok())
      st = s.OptTierOf(c) == ZeroTier::kNvme ? RestoreChunkToNvme(s, c, f, set)
                                             : RestoreChunkToMemory(s, c, f);
    for (int k = 0; st.ok() && k < kStateKinds; ++k) {
      auto sum = f.reader[k]->EndSection();
      st = sum.ok() ? CheckChunkChecksum(f.reader[k]->path(), *f.record[k], c, chunk_bytes, *sum)
                    : sum.status();
    }
  }
  if (set != nullptr) s.opt_staging.Give(set);
  for (int k = 0; st.ok() && k < kStateKinds; ++k) {
    const FileReader& r = *f.reader[k];
    if (r.contiguous() && r.read_end() == f.record[k]->bytes && r.file_xxh3() != f.record[k]->xxh3) {
      st = CorruptionError("checkpoint file " + r.path() + " has checksum " + ChecksumHex(r.file_xxh3()) +
                           ", the manifest says " + ChecksumHex(f.record[k]->xxh3));
    }
  }
  return st;
}

Status RestoreResharded(Engine::Impl& s, ReshardSource& src) {
  float* set = nullptr;
  if (s.opt_tier == ZeroTier::kNvme) {
    STRATA_ASSIGN_OR_RETURN(set, s.TakeOptStaging());
  }
  std::vector<float> bounce(std::min<int64_t>(s.opt_elems, kStreamBufferBytes / 4));
  Status st;
  for (int c = 0; st.ok() && c < s.layout.num_chunks; ++c) st = ReshardChunk(s, c, src, set, bounce);
  if (set != nullptr) s.opt_staging.Give(set);
  return st;
}

}  // namespace strata::ckpt
