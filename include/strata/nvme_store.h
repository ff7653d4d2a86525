// NvmeStore: swap space for fixed-size blocks on one or more NVMe paths.
//
// Layout: the store is `slot_count` slots of `slot_size` bytes, laid out one after the
// other in a logical space that is striped RAID-0 style over one swap file per path
// (stripe unit `stripe_size`, default the engine's block_size): logical stripe s lives
// in file s % paths at offset (s / paths) * stripe_size. A slot larger than a stripe is
// therefore read and written from every path in parallel.
//
// Files: for each directory in `paths`, `<dir>/<name>.swap` plus a lock file
// `<dir>/<name>.lock` holding the owner's pid under flock(LOCK_EX). Open:
//  - another live process (or another NvmeStore in this process) holding the lock:
//    FailedPrecondition naming the path and the owner pid; nothing is touched;
//  - a swap file left by a crashed run (lock file not held): removed, with a warning;
//  - the swap files are preallocated (fallocate) to their full size up front, so a disk
//    that is too small fails here, at once, with ResourceExhausted naming the path, the
//    size needed and the space free, rather than mid-run.
//  - prepare = kZeroFill additionally writes zeros over the whole file once, so later
//    writes are overwrites (see docs/benchmarks.md "NVMe I/O" for why and what it costs).
// Close() (or destruction) removes the swap and lock files.
//
// Checksums (strata.checksum, on by default): every Write records an xxHash (XXH3-64)
// per stripe-unit segment (cut also at the write's prefix, if it has one), computed on
// the engine's completion path in parallel with the rest of the transfer; every Read
// verifies them, and a mismatch is Corruption naming the path, slot, segment and file
// offset. Checksums live in memory only (the swap is scratch space for one run).
//
// Speculative updates (the tier manager's two-slot scheme): allocate two slots per
// block; write the new version into the slot not holding the committed one; commit by
// flipping which slot is current (no I/O); roll back by simply not flipping (the
// written slot is overwritten next time). NvmeStore needs nothing special for it: slots
// are independent, and a slot's contents and checksums are replaced only by a Write to
// that slot.
//
// Threads: all methods are thread-safe. A slot must not be read and written (or
// written twice) concurrently, and must not be freed with I/O in flight on it: the
// caller (the tier manager) serialises access per slot. Buffers follow IoEngine rules
// (aligned, caller-owned, untouched until the handle completes).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "strata/io.h"
#include "strata/status.h"

namespace strata {

enum class SwapPrepare {
  kFallocate,  // reserve extents only (fast start; first writes into them may be slower)
  kZeroFill,   // reserve, then write zeros once so every later write is an overwrite
};

struct NvmeStoreOptions {
  std::vector<std::string> paths;    // directories, one per device; created if missing
  std::string name = "strata-swap";  // file stem; use one per rank sharing a directory
  uint64_t slot_size = 0;            // bytes; rounded up to the engine's alignment
  uint64_t slot_count = 0;           // slots (two per block for speculative updates)
  uint64_t stripe_size = 0;          // 0: the engine's block_size; a multiple of its alignment
  bool checksum = true;
  SwapPrepare prepare = SwapPrepare::kFallocate;
};

using SlotId = uint32_t;

class NvmeStore {
 public:
  // Opens (creates, locks, preallocates) the swap files. `engine` must outlive the
  // store. Errors: InvalidArgument (options), FailedPrecondition (owned by a live
  // process), ResourceExhausted (disk too small), IoError/NotFound (paths).
  static Result<std::unique_ptr<NvmeStore>> Open(IoEngine& engine, const NvmeStoreOptions& options);

  ~NvmeStore();  // Close(), logging a failure
  NvmeStore(const NvmeStore&) = delete;
  NvmeStore& operator=(const NvmeStore&) = delete;

  // Takes a free slot; OutOfBudget naming the capacity when none is left.
  Result<SlotId> Allocate();
  // Returns a slot. Freeing a slot that is not allocated is FailedPrecondition.
  Status Free(SlotId slot);

  // Writes `length` bytes (<= slot_size, aligned) to the start of `slot`, replacing its
  // contents. The handle completes when the data (and its checksums) are stored; a
  // failed write leaves the slot unreadable (FailedPrecondition) until rewritten.
  // `prefix`: 0, or an aligned offset below `length` where a Read may stop (the first
  // `prefix` bytes alone are then readable and verified: the checksum segments are cut
  // there too); InvalidArgument otherwise.
  Result<IoHandle> Write(SlotId slot, const void* buffer, uint64_t length, uint64_t prefix = 0);
  // Reads back what the last successful Write stored: all of it (`length` equal to the
  // written length) or its `prefix` (`length` equal to that Write's non-zero prefix);
  // any other length is InvalidArgument. Wait() returns Corruption on a checksum
  // mismatch. `priority`: kUrgent for a read someone waits on, served before queued
  // normal I/O (IoPriority).
  Result<IoHandle> Read(SlotId slot, void* buffer, uint64_t length,
                        IoPriority priority = IoPriority::kNormal);
  // Reads back all that the last successful Write stored, as Read with its whole length
  // does, in at most `ranges` parts, all submitted at once in slot order: the caller can
  // use the first part while the rest are read. Each part is a run of whole checksum
  // segments, verified on its own, ending on the first segment boundary at least
  // length / ranges past its start. On a submit error it waits for the parts already
  // submitted and returns the error. InvalidArgument for ranges < 1; FailedPrecondition
  // as Read.
  struct Range {
    IoHandle read;
    uint64_t offset = 0, length = 0;  // in the slot, and so in `buffer`
  };
  Result<std::vector<Range>> ReadInRanges(SlotId slot, void* buffer, int ranges,
                                          IoPriority priority = IoPriority::kNormal);

  // Removes the swap and lock files. Refused (FailedPrecondition) with I/O in flight.
  // Idempotent.
  Status Close();

  uint64_t slot_size() const;
  uint64_t slot_count() const;
  uint64_t free_slots() const;
  uint64_t stripe_size() const;
  bool checksum() const;
  // The swap file paths, one per directory, in stripe order.
  std::vector<std::string> files() const;
  // Bytes preallocated per file.
  uint64_t file_size() const;

  struct Impl;

 private:
  explicit NvmeStore(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace strata
