// The NVMe optimizer (offload_optimizer nvme): each chunk's master | m | v live in NVMe
// slots, one per piece and version, and are stepped piece by piece through a pool of
// pinned staging sets. Reads run ahead (the rest of this chunk, then the chunks the
// backward finishes next), a piece steps, and its new state is written behind to the
// chunk's other version. A step's result becomes current only when it is committed and
// every piece of it is on disk, so a failure part-way loses nothing: a lost write rolls
// back its whole step on every chunk.
//
// A staging set goes back to the pool only when the I/O on it is done: a read's when the
// step takes it (or DropReads), a write's when it is found complete.
//
// Threads: one at a time steps, reads ahead or settles (the optimizer worker during the
// backward, the training thread in Step() and between steps). The engine decides what
// the step's output is for and when a speculative result is committed.
#pragma once

#include <oneapi/tbb/task_arena.h>

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <vector>

#include "strata/adam.h"
#include "strata/dtype.h"
#include "strata/nvme_store.h"
#include "strata/timeline.h"
#include "zero/buffer_pool.h"
#include "zero/optimizer_backend.h"
#include "zero/piece_plan.h"
#include "zero/save_gate.h"
#include "zero/write_behind.h"

namespace strata::zero {

class NvmeOptimizer final : public OptimizerBackend {
 public:
  struct Hooks {
    // Chunks whose state stays in pinned memory (partial residency): never read here.
    std::function<bool(int chunk)> resident;
    // Chunks the backward has stepped already: a read ahead going down skips them.
    std::function<bool(int chunk)> stepped;
    // `chunk`'s pending result is lost (a write of it failed). version_changed: its
    // committed version went back as well (RollBack), so whatever reads it must look
    // again.
    std::function<void(int chunk, bool version_changed)> lost;
  };
  // master_prefix: the master part of each piece is readable on its own (gathers read
  // stage-3 parameters from it, NvmeStore::Write's prefix). gate: checkpoint saves that
  // may still read a slot this writes.
  NvmeOptimizer(PieceShape shape, int num_chunks, bool master_prefix, SaveGate* gate, Hooks hooks);

  // --- set-up, before the first step ---
  void AddStagingSet(void* set);
  // Takes the store and allocates both versions of every piece of the chunks not
  // resident. Without a store (every chunk resident) nothing is ever read or written.
  Status AttachStore(std::unique_ptr<NvmeStore> store);
  void SetTimeline(Timeline* timeline, int track_nvme, int track_optimizer);
  NvmeStore* store() const { return store_.get(); }
  const PieceShape& shape() const { return shape_; }

  // --- the step ---
  ZeroTier tier() const override { return ZeroTier::kNvme; }
  // Steps every live piece of the chunk with `grad` (opt_elems values, host memory) into
  // `out` (its compute values, host memory; dead pieces' are zeroed; null in fp32 when
  // no one needs them, as the master is the copy, or each live piece's through
  // a.out_piece and a.piece_done; `grad` null: a.grad_piece gives each piece's). The new
  // state goes
  // to the version that is not current, written behind. Always true.
  Result<bool> Step(const OptimizerStep& a, const float* grad, void* out) override;
  // The version the last StepChunk wrote becomes current once its writes are on disk.
  void Commit(int chunk, int64_t epoch) override;
  // The pending version is simply the one the next step overwrites.
  void Discard(int /*chunk*/) override {}
  // Makes a deferred commit current once its writes are on disk (or returns their
  // error, with the previous state intact).
  Status SettleCommit(int chunk);
  // Undoes the commits of step `epoch` on every chunk: a deferred one is cancelled, a
  // settled one goes back to its previous version. That version is intact because no
  // write of a later step is issued before every write of `epoch` is on disk.
  void RollBack(int64_t epoch);
  // Issues reads for the pieces of `chunk` from first_piece on, then of next_chunk (and,
  // descending, the chunks below it), while sets are free and fewer than all but two
  // are reading ahead. Never waits.
  Status ReadAhead(int chunk, int first_piece, int next_chunk, bool descending);
  // The committed master values of a chunk's shard (opt_elems), read piece by piece.
  Status ReadMaster(int chunk, float* master) override;
  // Writes piece p of a chunk's committed version from `set` (master | m | v, Elems(p)
  // each; the rest of the set is zeroed) and waits: initial values, checkpoint restores.
  Status WriteCommitted(int chunk, int p, float* set);

  // --- staging and I/O in flight ---
  // A free staging set, else the oldest write's once it is on disk (its error if it
  // failed). Sets held by reads ahead are only ever released by this thread.
  Result<float*> TakeSet();
  void GiveSet(void* set) { staging_.Give(set); }
  // Waits for every write behind and returns the sets; the first error when `report`.
  Status WaitWrites(bool report);
  // Waits for the reads ahead no one took and returns their sets; the first error.
  Status DropReads();

  // --- versions ---
  SlotId Slot(int chunk, int version, int p) const { return versions_[chunk].slot[version][p]; }
  // The version the next read of the chunk uses (committed, or pending a deferred
  // commit), and the one the next step writes.
  int ReadVersion(int chunk) const;
  int WriteVersion(int chunk) const { return 1 - ReadVersion(chunk); }
  // The writes still queued to `version` of the chunk.
  std::vector<IoHandle> WritesTo(int chunk, int version) const;

  // What the I/O and the Adam did since the last call; resets them.
  struct Counters {
    uint64_t bytes_read = 0, bytes_written = 0;
    int64_t io_busy_ns = 0, adam_busy_ns = 0;
  };
  Counters TakeCounters();

 private:
  struct Versions {
    std::vector<SlotId> slot[2];  // by piece
    int current = 0;              // which version holds the committed state
    bool deferred = false;        // committed, current once its writes are on disk
    int64_t epoch = -1;           // the step that committed it
  };
  struct Read {
    float* buf = nullptr;
    IoHandle handle;
  };
  Status IssueRead(int chunk, int p);
  Status StepPiece(const OptimizerStep& a, int p, const float* grad, void* out);
  // The write of a stepped piece's state behind, to the version that is not current.
  Status WritePiece(const OptimizerStep& a, int p, float* st);
  void Span(int track, const std::string& name, std::chrono::steady_clock::time_point begin,
            uint64_t bytes = 0);

  const PieceShape shape_;
  const bool master_prefix_;
  SaveGate* const gate_;
  const Hooks hooks_;
  std::unique_ptr<NvmeStore> store_;
  std::vector<Versions> versions_;  // by chunk
  BufferPool staging_;
  int staging_sets_ = 0;
  std::map<int, Read> reads_;  // reads ahead, by shape_.Key
  WriteBehind writes_;
  Timeline* timeline_ = nullptr;
  int track_nvme_ = 0, track_optimizer_ = 0;
  std::atomic<uint64_t> bytes_read_{0}, bytes_written_{0};
  std::atomic<int64_t> io_busy_ns_{0}, adam_busy_ns_{0};
};

}  // namespace strata::zero
