#include "zero/piece_swap.h"

#include <string>

namespace strata::zero {

PieceSwap::PieceSwap(std::unique_ptr<NvmeStore> store, const PieceShape& shape, size_t elem_bytes)
    : store_(std::move(store)), shape_(shape), elem_bytes_(elem_bytes) {}

Result<std::unique_ptr<PieceSwap>> PieceSwap::Create(std::unique_ptr<NvmeStore> store,
                                                     const PieceShape& shape,
                                                     const std::vector<uint8_t>& on_disk, size_t elem_bytes) {
  std::unique_ptr<PieceSwap> s(new PieceSwap(std::move(store), shape, elem_bytes));
  s->slot_.assign(on_disk.size() * shape.pieces, 0);
  for (size_t c = 0; c < on_disk.size(); ++c) {
    if (!on_disk[c]) continue;
    for (int p = 0; p < shape.pieces; ++p) {
      if (!shape.Live(static_cast<int>(c), p)) continue;
      STRATA_ASSIGN_OR_RETURN(s->slot_[shape.Key(static_cast<int>(c), p)], s->store_->Allocate());
    }
  }
  return s;
}

Result<float*> PieceSwap::TakeWriteBuffer() {
  {
    std::lock_guard lock(mu_);
    writes_.Reclaim();
  }
  if (void* p = write_pool_.TryTake()) return static_cast<float*>(p);
  std::lock_guard lock(mu_);
  if (void* p = write_pool_.TryTake()) return static_cast<float*>(p);
  // Every buffer is out and none is being written: a caller kept one (a bug, reported
  // rather than waited for forever).
  if (writes_.empty()) return InternalError("piece swap: no piece buffer is free and none is being written");
  STRATA_ASSIGN_OR_RETURN(void* p, writes_.ReuseOldest());
  return static_cast<float*>(p);
}

Status PieceSwap::Write(int chunk, int p, float* buf) {
  const SlotId slot = slot_[shape_.Key(chunk, p)];
  std::lock_guard lock(mu_);
  // A rewrite (the next micro-batch's sum) must not overtake the write before it.
  Status st = writes_.WaitSlot(slot);
  Result<IoHandle> h = st.ok() ? store_->Write(slot, buf, piece_bytes(p)) : Result<IoHandle>(st);
  if (!h.ok()) {
    write_pool_.Give(buf);
    return h.status().WithContext("writing piece " + std::to_string(p) + " of chunk " +
                                  std::to_string(chunk) + " to NVMe");
  }
  writes_.Push(WriteBehind::Write{*h, buf, slot, -1, -1, "writing a piece of a shard to NVMe"});
  return OkStatus();
}

Result<IoHandle> PieceSwap::Read(int chunk, int p, float* buf) {
  const SlotId slot = slot_[shape_.Key(chunk, p)];
  {
    std::lock_guard lock(mu_);
    STRATA_RETURN_IF_ERROR(writes_.WaitSlot(slot));
  }
  return store_->Read(slot, buf, piece_bytes(p), IoPriority::kUrgent);
}

Status PieceSwap::WaitChunk(int chunk) {
  std::lock_guard lock(mu_);
  for (int p = 0; p < shape_.pieces; ++p) {
    if (shape_.Live(chunk, p)) STRATA_RETURN_IF_ERROR(writes_.WaitSlot(slot_[shape_.Key(chunk, p)]));
  }
  return OkStatus();
}

Status PieceSwap::Drain(bool report) {
  std::lock_guard lock(mu_);
  return writes_.Drain(report);
}

PieceReader::~PieceReader() { (void)Finish(); }

Result<const float*> PieceReader::Get(int p) {
  BufferPool& pool = store_->read_pool();
  if (current_ != nullptr) pool.Give(current_);
  current_ = nullptr;
  if (ahead_piece_ == p) {
    current_ = ahead_buf_;
    ahead_buf_ = nullptr;
    ahead_piece_ = -1;
    STRATA_RETURN_IF_ERROR(ahead_.Wait());
  } else {
    STRATA_RETURN_IF_ERROR(Finish());  // a read ahead of another piece is of no use
    current_ = static_cast<float*>(pool.Take());
    STRATA_ASSIGN_OR_RETURN(IoHandle h, store_->Read(chunk_, p, current_));
    STRATA_RETURN_IF_ERROR(h.Wait());
  }
  bytes_read_ += store_->piece_bytes(p);
  // A read ahead that cannot be issued is read again, and reported, when its piece comes.
  (void)IssueAhead(p);
  return static_cast<const float*>(current_);
}

Status PieceReader::IssueAhead(int after) {
  const PieceShape& shape = store_->shape();
  int next = after + 1;
  while (next < shape.pieces && !shape.Live(chunk_, next)) ++next;
  if (next >= shape.pieces) return OkStatus();
  float* buf = static_cast<float*>(store_->read_pool().Take());
  Result<IoHandle> h = store_->Read(chunk_, next, buf);
  if (!h.ok()) {
    store_->read_pool().Give(buf);
    return h.status();
  }
  ahead_ = *h;
  ahead_buf_ = buf;
  ahead_piece_ = next;
  return OkStatus();
}

Status PieceReader::Finish() {
  Status st;
  if (ahead_buf_ != nullptr) {
    st = ahead_.Wait();  // the buffer must be quiet before it goes back
    store_->read_pool().Give(ahead_buf_);
    ahead_buf_ = nullptr;
    ahead_piece_ = -1;
  }
  if (current_ != nullptr) store_->read_pool().Give(current_);
  current_ = nullptr;
  return st;
}

}  // namespace strata::zero
