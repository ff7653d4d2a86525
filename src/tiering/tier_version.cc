// Speculative versions over the two NVMe slots of a block: BeginVersion, Commit,
// Rollback.
#include "tiering/tier_internal.h"

namespace strata {

using tiering::Block;
using tiering::Copy;
using tiering::Move;

namespace {
Status CheckSpeculative(const TierManager::Impl& m, const Block* b, BlockId id) {
  std::string name = tiering::BlockName(m.options, id);
  if (b == nullptr) return NotFoundError(name + ": not registered");
  if (b->home != Tier::kNvme || b->nvme.nslots != 2)
    return FailedPreconditionError(name + ": speculative versions need a block homed on NVMe with two slots "
                                          "(nvme_slots_per_block = 2)");
  return OkStatus();
}
}  // namespace

Status TierManager::BeginVersion(std::span<const BlockId> blocks) {
  Impl& m = *impl_;
  for (const BlockId& id : blocks) {
    std::string name = tiering::BlockName(m.options, id);
    std::unique_lock<std::mutex> lock(m.mu);
    Block* b = m.Find(id);
    STRATA_RETURN_IF_ERROR(CheckSpeculative(m, b, id));
    if (b->speculating) return FailedPreconditionError(name + ": already speculating; Commit or Rollback first");
    if (b->write_pins[0] + b->write_pins[1] > 0)
      return FailedPreconditionError(name + ": pinned for writing; release it before BeginVersion");
    m.WaitBlockIdle(lock, id);
    b = m.Find(id);
    if (b == nullptr) return NotFoundError(name + ": unregistered meanwhile");
    if (b->nvme.committed_version == b->version && b->nvme.tentative < 0) {
      b->speculating = true;
      continue;
    }
    // The current version is not durable yet: write it to the other slot first.
    lock.unlock();
    STRATA_ASSIGN_OR_RETURN(BlockHandle h, m.AcquireImpl(id, Tier::kHost, Access::kRead, "begin-version", false));
    STRATA_RETURN_IF_ERROR(h.Wait());
    lock.lock();
    b = m.Find(id);
    tiering::NvmeCopy& n = b->nvme;
    m.cv.wait(lock, [&] { return !n.writing[0] && !n.writing[1] && n.readers[1 - n.committed] == 0; });
    int target = 1 - n.committed;
    if (n.tentative == target) n.tentative = -1;
    Copy& c = b->copies[1];
    Move mv;
    mv.kind = Move::Kind::kNvmeWrite;
    mv.block = id;
    mv.src = Tier::kHost;
    mv.dst = Tier::kNvme;
    mv.version = b->version;
    mv.slot = target;
    mv.src_ptr = c.ptr;
    mv.slots = n.slots[static_cast<size_t>(target)];
    mv.bytes = b->alloc;
    c.readers++;
    n.writing[static_cast<size_t>(target)] = true;
    const size_t host = static_cast<size_t>(tiering::TierIndex(Tier::kHost));
    b->evict_error[host] = OkStatus();  // the host copy's write
    m.Launch(std::move(mv));
    m.cv.wait(lock, [&] { return !n.writing[static_cast<size_t>(target)]; });
    Status written = b->evict_error[host];
    bool durable = n.committed_version == b->version;
    if (durable) b->speculating = true;
    lock.unlock();
    h.Release();
    if (!written.ok()) return written.WithContext("making " + name + " durable before a speculative version");
    if (!durable)
      return FailedPreconditionError(name + ": written while BeginVersion made it durable; retry");
  }
  return OkStatus();
}

Status TierManager::Commit(std::span<const BlockId> blocks) {
  Impl& m = *impl_;
  for (const BlockId& id : blocks) {
    std::unique_lock<std::mutex> lock(m.mu);
    Block* b = m.Find(id);
    STRATA_RETURN_IF_ERROR(CheckSpeculative(m, b, id));
    tiering::NvmeCopy& n = b->nvme;
    m.cv.wait(lock, [&] { return !n.writing[0] && !n.writing[1]; });
    if (n.tentative >= 0) {
      n.committed = n.tentative;
      n.committed_version = n.tentative_version;
      n.zero = false;
      n.tentative = -1;
    }
    b->speculating = false;
  }
  return OkStatus();
}

Status TierManager::Rollback(std::span<const BlockId> blocks) {
  Impl& m = *impl_;
  for (const BlockId& id : blocks) {
    std::string name = tiering::BlockName(m.options, id);
    std::unique_lock<std::mutex> lock(m.mu);
    Block* b = m.Find(id);
    STRATA_RETURN_IF_ERROR(CheckSpeculative(m, b, id));
    if (!b->speculating) return FailedPreconditionError(name + ": no tentative version to roll back");
    if (b->pins[0] + b->pins[1] > 0)
      return FailedPreconditionError(name + ": pinned; release it before Rollback");
    m.WaitBlockIdle(lock, id);
    b = m.Find(id);
    if (b == nullptr) return NotFoundError(name + ": unregistered meanwhile");
    const uint64_t committed = b->nvme.committed_version;
    STRATA_CHECK(committed != 0);
    for (int t = 0; t < 2; ++t) {
      if (b->copies[static_cast<size_t>(t)].version != committed) m.FreeCopy(*b, tiering::TierAt(t));
    }
    b->nvme.tentative = -1;
    b->version = committed;
    b->speculating = false;
    b->pending_error = OkStatus();
    m.cv.notify_all();
  }
  return OkStatus();
}

}  // namespace strata
