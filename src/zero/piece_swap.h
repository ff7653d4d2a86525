// A swap cut into the NVMe optimizer's pieces (PieceShape): a slot per live piece of each
// chunk's shard, for shards too large for a whole-shard pinned buffer. Its users: the fp32
// gradient shards (EnginePlan::stream_grads) and the 16-bit parameter shards of streamed
// bf16/fp16 (stream_pieces without param_from_master). Writes go behind through a few
// pinned piece buffers, each back in its pool once its write is on disk; a shard is read
// back a piece at a time, one piece ahead of its user (PieceReader), or a piece at a time
// by the gathers. Pinned memory is then a few pieces, whatever the module's size.
//
// Threads: writes come from one thread at a time (the reduction's worker, or the thread
// that steps), reads from any; a read of a piece waits for that piece's write (the store
// does not order them).
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

class PieceSwap {
 public:
  // Slots for the live pieces of the chunks marked in `on_disk` (by chunk), of
  // `elem_bytes` per element; the store's slots must hold a piece (PieceShape::SlotBytes). Writes go
  // through the write buffers, a PieceReader's reads through the read buffers (pinned,
  // PieceShape::SlotBytes long each).
  static Result<std::unique_ptr<PieceSwap>> Create(std::unique_ptr<NvmeStore> store, const PieceShape& shape,
                                                   const std::vector<uint8_t>& on_disk, size_t elem_bytes);
  void AddWriteBuffer(float* buf) { write_pool_.Add(buf); }
  void AddReadBuffer(float* buf) { read_pool_.Add(buf); }

  // A free write buffer: waits for the oldest write behind when none is free; its error,
  // or Internal when every buffer is out and none is being written.
  Result<float*> TakeWriteBuffer();
  void GiveWriteBuffer(float* buf) { write_pool_.Give(buf); }
  // Writes piece p of `chunk` from buf (taken from TakeWriteBuffer), behind: buf comes
  // back once it is on disk. Errors of issuing it (buf is back then).
  Status Write(int chunk, int p, float* buf);
  // Reads piece p of `chunk` into buf once its write is done; the read's handle.
  Result<IoHandle> Read(int chunk, int p, float* buf);
  // Waits for the writes of `chunk`'s pieces; the first error.
  Status WaitChunk(int chunk);
  // Waits for every write and returns the buffers; the first error when `report`.
  Status Drain(bool report);

  BufferPool& read_pool() { return read_pool_; }
  const PieceShape& shape() const { return shape_; }
  uint64_t piece_bytes(int p) const { return Align(shape_.Elems(p) * elem_bytes_); }
  size_t elem_bytes() const { return elem_bytes_; }

 private:
  PieceSwap(std::unique_ptr<NvmeStore> store, const PieceShape& shape, size_t elem_bytes);
  static uint64_t Align(uint64_t bytes) { return (bytes + 4095) / 4096 * 4096; }

  std::unique_ptr<NvmeStore> store_;
  const PieceShape shape_;
  const size_t elem_bytes_;
  std::vector<SlotId> slot_;  // by PieceShape::Key
  BufferPool write_pool_, read_pool_;
  std::mutex mu_;  // writes_
  WriteBehind writes_{&write_pool_};
};

// One user's reads of a chunk's pieces, in piece order, each read issued when the piece
// before it is handed out. Two read buffers: the piece in use and the next.
class PieceReader {
 public:
  PieceReader(PieceSwap* store, int chunk) : store_(store), chunk_(chunk) {}
  ~PieceReader();  // Finish(), its error dropped
  // Piece p; valid until the next call or Finish(). Pieces in ascending order.
  Result<const float*> Get(int p);
  // Waits for the read ahead and returns the buffers; the read's error.
  Status Finish();
  uint64_t bytes_read() const { return bytes_read_; }

 private:
  Status IssueAhead(int after);

  PieceSwap* store_;
  const int chunk_;
  float* current_ = nullptr;
  int ahead_piece_ = -1;
  float* ahead_buf_ = nullptr;
  IoHandle ahead_;
  uint64_t bytes_read_ = 0;
};

}  // namespace strata::zero
