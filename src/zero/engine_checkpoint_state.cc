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
Status SaveChunkFromMemory(const StateSnapshot::Chunk& c, int64_t elems, Writers& w) {
  const uint64_t bytes = elems * 4;
  for (int k = 0; k < kStateKinds; ++k) {
    const uint8_t* src = reinterpret_cast<const uint8_t*>(c.state + k * elems);
    for (uint64_t done = 0; done < bytes;) {
      STRATA_ASSIGN_OR_RETURN(std::span<uint8_t> room, w[k]->Space(bytes - done));
      STRATA_RETURN_IF_ERROR(
          c.ops->ReadToHost(zero::OpsLane::kTraining, room.data(), src + done, room.size()));
      w[k]->Commit(room.size());
      done += room.size();
    }
  }
  return OkStatus();
}

// The committed NVMe state of every chunk, piece by piece, with the next piece's read in
// flight while one is split into the files (two buffers of the saver's own, so the
// optimizer's staging sets stay the optimizer's while training goes on).
class NvmeSaver {
 public:
  NvmeSaver(const StateSnapshot& snap, Writers& w, zero::SaveGate& gate) : snap_(snap), w_(w), gate_(gate) {}
  ~NvmeSaver() {
    for (Read& r : reads_) r.handle.Wait().IgnoreError();
  }

  Status Init(HostArena* arena) {
    auto b = StreamBuffers::Create(arena, snap_.piece_bytes);
    if (!b.ok()) return b.status();
    bufs_ = std::move(*b);
    free_ = {reinterpret_cast<float*>(bufs_->at(0)), reinterpret_cast<float*>(bufs_->at(1))};
    return OkStatus();
  }

  // The chunk's pieces into the files (the memory chunks of partial residency go as on
  // the host tier).
  Status SaveChunk(int c) {
    const StateSnapshot::Chunk& chunk = snap_.chunks[c];
    if (chunk.state != nullptr) return SaveChunkFromMemory(chunk, snap_.shape.opt_elems, w_);
    for (int p = 0; p < snap_.shape.pieces; ++p) STRATA_RETURN_IF_ERROR(SavePiece(c, p));
    return OkStatus();
  }

 private:
  struct Read {
    float* buf = nullptr;
    SlotId slot = 0;
    IoHandle handle;
  };

  // Issues reads of the next live NVMe pieces into free buffers.
  Status ReadAhead() {
    const int total = static_cast<int>(snap_.chunks.size()) * snap_.shape.pieces;
    while (!free_.empty() && next_ < total) {
      const int c = next_ / snap_.shape.pieces, p = next_ % snap_.shape.pieces;
      const StateSnapshot::Chunk& chunk = snap_.chunks[c];
      if (chunk.state == nullptr && chunk.live[p]) {
        auto rd = snap_.store->Read(chunk.slots[p], free_.back(), snap_.shape.Bytes(p));
        if (!rd.ok())
          return rd.status().WithContext("checkpoint: reading the optimizer state of chunk " +
                                         std::to_string(c));
        reads_.push_back({free_.back(), chunk.slots[p], *rd});
        free_.pop_back();
      }
      ++next_;
    }
    return OkStatus();
  }

  Status SavePiece(int c, int p) {
    const uint64_t bytes = snap_.shape.Elems(p) * 4;
    if (!snap_.chunks[c].live[p]) {
      // Wholly padding: never stepped, so zero (the engine never wrote its slot).
      for (auto& writer : w_) STRATA_RETURN_IF_ERROR(writer->AppendZeros(bytes));
      return OkStatus();
    }
    STRATA_RETURN_IF_ERROR(ReadAhead());
    Read r = reads_.front();
    reads_.pop_front();
    free_.push_back(r.buf);  // back to the free list whatever happens below
    STRATA_RETURN_IF_ERROR(r.handle.Wait().WithContext("checkpoint: reading the optimizer state of chunk " +
                                                       std::to_string(c) + " piece " + std::to_string(p)));
    gate_.Release(zero::SaveGate::SlotKey(r.slot));  // read: the optimizer may overwrite it
    for (int k = 0; k < kStateKinds; ++k) {
      STRATA_RETURN_IF_ERROR(w_[k]->Append(r.buf + k * snap_.shape.Elems(p), bytes));
    }
    return OkStatus();
  }

  const StateSnapshot& snap_;
  Writers& w_;
  zero::SaveGate& gate_;
  std::unique_ptr<StreamBuffers> bufs_;
  std::vector<float*> free_;
  std::deque<Read> reads_;
  int next_ = 0;  // the next piece (chunk * pieces + piece) to read
};

Status RestoreChunkToMemory(Engine::Impl& s, int chunk, StateReaders& f) {
  zero::DeviceOps& ops = s.OpsOn(s.OptTierOf(chunk));
  const uint64_t bytes = s.opt_elems * 4;
  for (int k = 0; k < kStateKinds; ++k) {
    uint8_t* dst = reinterpret_cast<uint8_t*>(s.StateOf(chunk) + k * s.opt_elems);
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
  return s.nvme_opt->WriteCommitted(chunk, p, set)
      .WithContext("checkpoint: writing the optimizer state of chunk " + std::to_string(chunk) + " to NVMe");
}

// Each live piece assembled from the three files in one staging set.
Status RestoreChunkToNvme(Engine::Impl& s, int chunk, StateReaders& f, float* set) {
  for (int p = 0; p < s.piece_shape.pieces; ++p) {
    const int64_t n = s.piece_shape.Elems(p);
    if (!s.piece_shape.Live(chunk, p)) {
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
    for (int p = 0; p < s.piece_shape.pieces; ++p) {
      if (!s.piece_shape.Live(chunk, p)) continue;  // wholly padding: never read, so never written
      const int64_t n = s.piece_shape.Elems(p);
      for (int k = 0; k < kStateKinds; ++k)
        STRATA_RETURN_IF_ERROR(src.Read(k, chunk, p * s.piece_shape.piece_elems, n, set + k * n));
      STRATA_RETURN_IF_ERROR(WritePiece(s, chunk, p, set));
    }
    s.SyncParamSource(chunk);
    return OkStatus();
  }
  zero::DeviceOps& ops = s.OpsOn(s.OptTierOf(chunk));
  for (int k = 0; k < kStateKinds; ++k) {
    float* dst = s.StateOf(chunk) + k * s.opt_elems;
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

StateSnapshot Snapshot(Engine::Impl& s) {
  StateSnapshot snap;
  snap.rank = s.rank;
  snap.shape.opt_elems = s.opt_elems;
  snap.shape.piece_elems = s.opt_tier == ZeroTier::kNvme ? s.piece_shape.piece_elems : s.opt_elems;
  snap.shape.pieces = s.opt_tier == ZeroTier::kNvme ? s.piece_shape.pieces : 1;
  snap.piece_bytes = snap.shape.Bytes(0);
  snap.store = s.nvme_opt ? s.nvme_opt->store() : nullptr;
  for (int c = 0; c < s.layout.num_chunks; ++c) {
    StateSnapshot::Chunk chunk;
    const ZeroTier tier = s.OptTierOf(c);
    snap.on_device |= tier == ZeroTier::kDevice;
    if (tier == ZeroTier::kNvme) {
      // Settled: Flush ran first.
      for (int p = 0; p < s.piece_shape.pieces; ++p) {
        chunk.slots.push_back(s.nvme_opt->Slot(c, s.nvme_opt->ReadVersion(c), p));
        chunk.live.push_back(s.piece_shape.Live(c, p));
      }
    } else {
      chunk.state = s.StateOf(c);
      chunk.ops = &s.OpsOn(tier);
    }
    snap.chunks.push_back(std::move(chunk));
  }
  return snap;
}

std::vector<uint64_t> GateKeys(const StateSnapshot& snap) {
  std::vector<uint64_t> keys;
  for (const StateSnapshot::Chunk& c : snap.chunks) {
    if (c.state != nullptr) keys.push_back(zero::SaveGate::MemoryKey(c.state));
    for (size_t p = 0; p < c.slots.size(); ++p) {
      if (c.live[p]) keys.push_back(zero::SaveGate::SlotKey(c.slots[p]));
    }
  }
  return keys;
}

Status WriteStateFiles(const StateSnapshot& snap, IoEngine& io, HostArena* arena, const std::string& tmp,
                       zero::SaveGate& gate, std::vector<CheckpointFileInfo>* files) {
  struct ReleaseAll {
    zero::SaveGate& gate;
    ~ReleaseAll() { gate.ReleaseAll(); }  // done or failed: nothing is held any more
  } release{gate};
  Writers w;
  for (int k = 0; k < kStateKinds; ++k) {
    STRATA_ASSIGN_OR_RETURN(w[k], FileWriter::Create(io, arena, tmp + "/" + StateFileName(k, snap.rank)));
  }
  std::array<std::vector<uint64_t>, kStateKinds> sums;
  NvmeSaver nvme(snap, w, gate);
  if (snap.store != nullptr) STRATA_RETURN_IF_ERROR(nvme.Init(arena));
  for (size_t c = 0; c < snap.chunks.size(); ++c) {
    for (auto& writer : w) writer->BeginSection();
    STRATA_RETURN_IF_ERROR(nvme.SaveChunk(static_cast<int>(c)));
    // A chunk in memory is read once the stream buffers hold it.
    if (snap.chunks[c].state != nullptr) gate.Release(zero::SaveGate::MemoryKey(snap.chunks[c].state));
    for (int k = 0; k < kStateKinds; ++k) {
      STRATA_ASSIGN_OR_RETURN(uint64_t sum, w[k]->EndSection());
      sums[k].push_back(sum);
    }
  }
  for (int k = 0; k < kStateKinds; ++k) {
    STRATA_RETURN_IF_ERROR(w[k]->Finish());
    files->push_back(
        {StateFileName(k, snap.rank), snap.rank, kKindNames[k], w[k]->bytes(), w[k]->xxh3(), sums[k]});
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
    STRATA_ASSIGN_OR_RETURN(set, s.nvme_opt->TakeSet());
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
  if (set != nullptr) s.nvme_opt->GiveSet(set);
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
    STRATA_ASSIGN_OR_RETURN(set, s.nvme_opt->TakeSet());
  }
  std::vector<float> bounce(std::min<int64_t>(s.opt_elems, kStreamBufferBytes / 4));
  Status st;
  for (int c = 0; st.ok() && c < s.layout.num_chunks; ++c) st = ReshardChunk(s, c, src, set, bounce);
  if (set != nullptr) s.nvme_opt->GiveSet(set);
  return st;
}

}  // namespace strata::ckpt
