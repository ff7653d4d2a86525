// Reading a checkpoint into a layout other than the one it was saved in: another world
// size, stage 0 (replicas) against a sharded stage, or another strata.chunk_size. The
// saved state is not rewritten first (as DeepSpeed's ds_to_universal does): each rank
// pulls the values of its own shards, tensor by tensor, straight from the saving ranks'
// files.
//
// A value's way: this engine's (chunk, position in the chunk) -> the tensor there and
// the element in it -> that tensor's place in the saved layout -> the saving rank whose
// shard holds it and the byte in that rank's file. Padding (no tensor) reads as zeros.
//
// Checksums: the sections (one saving rank's shard of one saved chunk) that a rank takes
// values from are each read whole and checked against the manifest before any value is
// copied (Verify), so a resharding load reads what it uses twice, and never copies a
// corrupt value. Host memory: one 4 MiB window per state kind, plus the two 4 MiB stream
// buffers of the checksum pass: 20 MiB, whatever the model size.
//
// Threads: one owner.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "strata/host_arena.h"
#include "strata/io.h"
#include "zero/checkpoint_manifest.h"
#include "zero/checkpoint_stream.h"
#include "zero/layout.h"

namespace strata::ckpt {

class ReshardSource {
 public:
  // `layout`: the loading engine's; this rank's shard of every chunk is the elements
  // [opt_offset, opt_offset + opt_elems) of the chunk. `m` must describe the same model
  // (names and shapes: the caller checks) and outlive the source, as must `layout`.
  // Corruption when the manifest's layout does not hold its tensors.
  static Result<std::unique_ptr<ReshardSource>> Open(IoEngine& io, HostArena* arena, const std::string& dir,
                                                     const Manifest& m, const zero::Layout& layout,
                                                     int64_t opt_offset, int64_t opt_elems);
  ~ReshardSource();
  ReshardSource(const ReshardSource&) = delete;
  ReshardSource& operator=(const ReshardSource&) = delete;

  // Reads every saved section this rank's shards take values from and checks its
  // checksum: Corruption naming the file, chunk and bytes; NotFound naming a missing
  // file and its rank; Corruption for a file of the wrong size.
  Status Verify();
  // Fills dst[0, n) with the `kind` values (kKindNames) of elements [begin, begin + n) of
  // this rank's shard of `chunk`. Call after Verify.
  Status Read(int kind, int chunk, int64_t begin, int64_t n, float* dst);

  // Saved sections this rank reads: (saving rank, saved chunk), ascending.
  const std::set<std::pair<int, int>>& sections() const { return sections_; }

 private:
  ReshardSource() = default;
  // Calls f(at, n, saved_rank, byte) for each run of saved values that elements [lo, hi)
  // of this engine's `chunk` come from: `at` counts from lo, `byte` is in the saved rank's
  // file. Runs come in ascending `at`; elements in no run are padding.
  template <typename F>
  void ForEachRun(int chunk, int64_t lo, int64_t hi, F&& f) const;
  // Copies `bytes` from the saved rank's file of `kind` at `byte` into dst, through the
  // kind's window.
  Status Copy(int kind, int rank, uint64_t byte, uint64_t bytes, uint8_t* dst);
  Result<OpenFile*> File(int kind, int rank);
  std::string Path(int kind, int rank) const;

  IoEngine* io_ = nullptr;
  HostArena* arena_ = nullptr;
  std::string dir_;
  const Manifest* m_ = nullptr;
  const zero::Layout* layout_ = nullptr;
  int64_t opt_offset_ = 0, opt_elems_ = 0;
  std::set<std::pair<int, int>> sections_;
  bool verified_ = false;
  struct Window {
    uint8_t* data = nullptr;
    int rank = -1;
    uint64_t begin = 0, end = 0;  // file bytes it holds
  };
  std::array<Window, kStateKinds> window_;
  std::array<std::vector<std::unique_ptr<OpenFile>>, kStateKinds> files_;  // by saving rank
};

}  // namespace strata::ckpt
