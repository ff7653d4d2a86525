// Coalesces small tensors into bucket-sized collectives (flatten, launch, scatter back).
#include <algorithm>
#include <cstddef>
#include <deque>
#include <vector>

#include "strata/comm.h"
#include "strata/units.h"

namespace strata {
namespace {

struct Tensor {
  const void* send;
  void* recv;
  size_t count;  // per rank for AllGather/ReduceScatter, total for AllReduce
};

struct Slot {
  void* in = nullptr;   // staging the collective reads
  void* out = nullptr;  // staging it writes (== in for AllReduce)
  std::vector<Tensor> tensors;
  size_t fill = 0;  // elements per rank (AllGather/ReduceScatter) or total (AllReduce)
  CommHandle handle;
  bool busy = false;
};

class BucketerImpl final : public Bucketer {
 public:
  BucketerImpl(Communicator& comm, const BucketOptions& o) : comm_(comm), o_(o), ds_(DTypeSize(o.dtype)) {
    p_ = static_cast<size_t>(comm.size());
    cap_ = o.kind == CollectiveKind::kAllReduce ? o.bucket_elements : o.bucket_elements / p_;
  }
  ~BucketerImpl() override {
    Finish().IgnoreError();  // buffers must not be freed under a running collective
    for (Slot& s : slots_) {
      comm_.FreeBuffer(s.in);
      if (s.out != s.in) comm_.FreeBuffer(s.out);
    }
  }

  Status Init() {
    if (cap_ == 0) {
      return InvalidArgumentError("bucketer: bucket_elements " + std::to_string(o_.bucket_elements) +
                                  " is smaller than the communicator size " + std::to_string(p_));
    }
    if (o_.max_in_flight < 1) return InvalidArgumentError("bucketer: max_in_flight must be >= 1");
    slots_.resize(static_cast<size_t>(o_.max_in_flight));
    size_t full = cap_ * (o_.kind == CollectiveKind::kAllReduce ? 1 : p_) * ds_;
    size_t part = cap_ * ds_;
    for (Slot& s : slots_) {
      switch (o_.kind) {
        case CollectiveKind::kAllGather: {
          STRATA_ASSIGN_OR_RETURN(s.in, comm_.AllocateBuffer(part));
          STRATA_ASSIGN_OR_RETURN(s.out, comm_.AllocateBuffer(full));
          break;
        }
        case CollectiveKind::kReduceScatter: {
          STRATA_ASSIGN_OR_RETURN(s.in, comm_.AllocateBuffer(full));
          STRATA_ASSIGN_OR_RETURN(s.out, comm_.AllocateBuffer(part));
          break;
        }
        case CollectiveKind::kAllReduce: {
          STRATA_ASSIGN_OR_RETURN(s.in, comm_.AllocateBuffer(full));
          s.out = s.in;
          break;
        }
      }
    }
    return OkStatus();
  }

  Status Add(const void* send, void* recv, size_t count) override {
    if (count == 0) return OkStatus();
    if (send == nullptr || recv == nullptr) return InvalidArgumentError("bucketer: null tensor buffer");
    if (count > cap_) {  // big enough on its own: no staging, no copies
      STRATA_RETURN_IF_ERROR(Launch());
      STRATA_RETURN_IF_ERROR(MakeRoom());
      direct_.push_back(Run(send, recv, count));
      ++launched_;
      return OkStatus();
    }
    if (cur_.fill + count > cap_) STRATA_RETURN_IF_ERROR(Launch());
    cur_.tensors.push_back({send, recv, count});
    cur_.fill += count;
    return OkStatus();
  }

  Status Finish() override {
    Status first = Launch();
    for (size_t i = 0; i < slots_.size(); ++i) {
      Status s = Complete(slots_[(next_ + i) % slots_.size()]);
      if (first.ok()) first = s;
    }
    for (CommHandle& h : direct_) {
      Status s = h.Wait();
      if (first.ok()) first = s;
    }
    direct_.clear();
    cur_ = Pending();
    return first;
  }

  uint64_t collectives_launched() const override { return launched_; }

 private:
  struct Pending {
    std::vector<Tensor> tensors;
    size_t fill = 0;
  };

  CommHandle Run(const void* send, void* recv, size_t count) {
    switch (o_.kind) {
      case CollectiveKind::kAllGather: return comm_.AllGather(send, recv, count, o_.dtype);
      case CollectiveKind::kReduceScatter: return comm_.ReduceScatter(send, recv, count, o_.dtype, o_.op);
      case CollectiveKind::kAllReduce: break;
    }
    return comm_.AllReduce(send, recv, count, o_.dtype, o_.op);
  }

  std::byte* At(void* base, size_t elems) { return static_cast<std::byte*>(base) + elems * ds_; }
  const std::byte* At(const void* base, size_t elems) { return static_cast<const std::byte*>(base) + elems * ds_; }

  // Bounds what is in flight: direct collectives and buckets together.
  Status MakeRoom() {
    while (direct_.size() >= slots_.size()) {
      STRATA_RETURN_IF_ERROR(direct_.front().Wait());
      direct_.pop_front();
    }
    return OkStatus();
  }

  Status Launch() {
    if (cur_.tensors.empty()) return OkStatus();
    Slot& s = slots_[next_];
    STRATA_RETURN_IF_ERROR(Complete(s));
    next_ = (next_ + 1) % slots_.size();
    s.tensors = std::move(cur_.tensors);
    s.fill = cur_.fill;
    cur_ = Pending();
    size_t off = 0;
    for (const Tensor& t : s.tensors) {  // flatten
      switch (o_.kind) {
        case CollectiveKind::kAllGather:
        case CollectiveKind::kAllReduce:
          STRATA_RETURN_IF_ERROR(comm_.CopyBuffer(At(s.in, off), t.send, t.count * ds_));
          break;
        case CollectiveKind::kReduceScatter:
          for (size_t r = 0; r < p_; ++r) {
            STRATA_RETURN_IF_ERROR(comm_.CopyBuffer(At(s.in, r * s.fill + off), At(t.send, r * t.count), t.count * ds_));
          }
          break;
      }
      off += t.count;
    }
    s.handle = Run(s.in, s.out, s.fill);
    s.busy = true;
    ++launched_;
    return OkStatus();
  }

  Status Complete(Slot& s) {
    if (!s.busy) return OkStatus();
    s.busy = false;
    Status st = s.handle.Wait();
    if (st.ok()) {
      size_t off = 0;
      for (const Tensor& t : s.tensors) {  // scatter back
        switch (o_.kind) {
          case CollectiveKind::kAllGather:
            for (size_t r = 0; r < p_ && st.ok(); ++r) {
              st = comm_.CopyBuffer(At(t.recv, r * t.count), At(s.out, r * s.fill + off), t.count * ds_);
            }
            break;
          case CollectiveKind::kReduceScatter:
          case CollectiveKind::kAllReduce:
            st = comm_.CopyBuffer(t.recv, At(s.out, off), t.count * ds_);
            break;
        }
        if (!st.ok()) break;
        off += t.count;
      }
    }
    s.tensors.clear();
    s.fill = 0;
    return st;
  }

  Communicator& comm_;
  BucketOptions o_;
  size_t ds_;
  size_t p_ = 1;
  size_t cap_ = 0;
  std::vector<Slot> slots_;
  size_t next_ = 0;
  Pending cur_;
  std::deque<CommHandle> direct_;
  uint64_t launched_ = 0;
};

}  // namespace

Result<std::unique_ptr<Bucketer>> Bucketer::Create(Communicator& comm, const BucketOptions& options) {
  auto b = std::make_unique<BucketerImpl>(comm, options);
  STRATA_RETURN_IF_ERROR(b->Init());
  return std::unique_ptr<Bucketer>(std::move(b));
}

}  // namespace strata
