// Gradient shards on NVMe in pieces, for shards too large for any whole-shard pinned
// buffer (EnginePlan::stream_grads): each live piece of a chunk's fp32 gradient shard has
// a slot of its own, cut as the NVMe optimizer cuts the state (PieceShape). The
// reduction writes a shard a piece at a time through a few pinned piece buffers, each
// back in its pool once its write is on disk; the step reads it back a piece at a time,
// one piece ahead of the one it steps (GradPieceReader). Pinned memory is then a few
// pieces, whatever the module's size.
//
// Threads: writes come from the reduction's worker, reads from the thread that steps;
// a read of a piece waits for that piece's write (the store does not order them).
#pragma once

#include <memory>
#include <mutex>
#include <vector>

#include "strata/nvme_store.h"
#include "strata/status.h"
#include "zero/buffer_pool.h"
#include "zero/piece_plan.h"
#include "zero/write_behind.h"

namespace strata::zero {

class GradPieceStore {
 public:
  // Slots for the live pieces of the chunks marked in `on_disk` (by chunk). The store's
  // slots must be at least one piece of fp32 long. Writes go through write_buffers, the
  // reader's reads through read_buffers (pinned, a piece long each).
  static Result<std::unique_ptr<GradPieceStore>> Create(std::unique_ptr<NvmeStore> store,
                                                        const PieceShape& shape,
                                                        const std::vector<uint8_t>& on_disk);
  void AddWriteBuffer(float* buf) { write_pool_.Add(buf); }
  void AddReadBuffer(float* buf) { read_pool_.Add(buf); }

  // A free write buffer: waits for the oldest write behind when none is free; its error.
  Result<float*> TakeWriteBuffer();
  void GiveWriteBuffer(float* buf) { write_pool_.Give(buf); }
  // Writes piece p of `chunk` from buf (taken from TakeWriteBuffer), behind: buf comes
  // back once it is on disk. Errors of issuing it (buf is back then).
  Status Write(int chunk, int p, float* buf);
  // Reads piece p of `chunk` into buf once its write is done; the read's handle.
  Result<IoHandle> Read(int chunk, int p, float* buf);
  // Waits for every write and returns the buffers; the first error when `report`.
  Status Drain(bool report);

  BufferPool& read_pool() { return read_pool_; }
  const PieceShape& shape() const { return shape_; }
  uint64_t piece_bytes(int p) const { return Align(shape_.Elems(p) * 4); }

 private:
  GradPieceStore(std::unique_ptr<NvmeStore> store, const PieceShape& shape);
  static uint64_t Align(uint64_t bytes) { return (bytes + 4095) / 4096 * 4096; }

  std::unique_ptr<NvmeStore> store_;
  const PieceShape shape_;
  std::vector<SlotId> slot_;  // by PieceShape::Key
  BufferPool write_pool_, read_pool_;
  std::mutex mu_;  // writes_
  WriteBehind writes_{&write_pool_};
};

// One step's reads of a chunk's gradient pieces, in piece order, each read issued when
// the piece before it is handed out. Two read buffers: the piece stepped and the next.
class GradPieceReader {
 public:
  GradPieceReader(GradPieceStore* store, int chunk) : store_(store), chunk_(chunk) {}
  ~GradPieceReader();  // Finish(), its error dropped
  // Piece p's gradient; valid until the next call or Finish(). Pieces in ascending order.
  Result<const float*> Get(int p);
  // Waits for the read ahead and returns the buffers; the read's error.
  Status Finish();
  uint64_t bytes_read() const { return bytes_read_; }

 private:
  Status IssueAhead(int after);

  GradPieceStore* store_;
  const int chunk_;
  float* current_ = nullptr;
  int ahead_piece_ = -1;
  float* ahead_buf_ = nullptr;
  IoHandle ahead_;
  uint64_t bytes_read_ = 0;
};

}  // namespace strata::zero
