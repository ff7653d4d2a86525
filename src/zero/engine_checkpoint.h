// The engine's side of checkpoints (Engine::SaveCheckpoint / LoadCheckpoint): the
// agreement between ranks, and streaming each rank's optimizer state between its tier
// and the checkpoint files. engine_checkpoint.cc saves, engine_checkpoint_load.cc loads,
// engine_checkpoint_state.cc moves the bytes.
#pragma once

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "strata/checkpoint.h"
#include "zero/checkpoint_manifest.h"
#include "zero/checkpoint_reshard.h"
#include "zero/checkpoint_stream.h"
#include "zero/engine_impl.h"
#include "zero/piece_plan.h"
#include "zero/save_gate.h"

namespace strata::ckpt {

// Every rank's `mine` (the same length on every rank), rank by rank: a collective over
// the world on the comm worker; `mine` itself at world size 1.
Result<std::vector<uint64_t>> ExchangeWords(Engine::Impl& s, const std::vector<uint64_t>& mine);
// Collective: OK when `local` is OK on every rank. Else this rank's own error, or
// Aborted naming the first rank that failed (which logs its error), with `what` as context.
Status AgreeOnStatus(Engine::Impl& s, const Status& local, const std::string& what);
// FailedPrecondition unless the engine is between Step() and the next micro-batch, with
// no hook holding a chunk and no earlier failure; `call` names the caller.
Status CheckCanCheckpoint(Engine::Impl& s, const char* call);
// The I/O engine a save or load uses: the engine's own (NVMe tiers), else a new one made
// from the config into *own (with the engine's test fault hook).
Result<IoEngine*> CheckpointIo(Engine::Impl& s, std::unique_ptr<IoEngine>* own);
// Bytes of one chunk's state in each state file: the rank's part, 4 KiB aligned.
uint64_t ChunkBytes(const Engine::Impl& s);

// Where a save reads each chunk's state from, fixed when the save starts (after Flush,
// on the training thread): the buffer in memory, or each piece's committed NVMe slot.
// The engine may step on while a save reads it: the gate (save_gate.h) keeps the
// optimizer off each block until it is read.
struct StateSnapshot {
  int rank = 0;
  // The pieces the state is read in: the NVMe optimizer's, else one piece a chunk.
  zero::PieceShape shape;
  uint64_t piece_bytes = 0;  // the largest piece's master | m | v, 4 KiB aligned
  NvmeStore* store = nullptr;
  struct Chunk {
    const float* state = nullptr;  // master | m | v in memory, read by `ops`
    zero::DeviceOps* ops = nullptr;
    std::vector<SlotId> slots;  // else on NVMe: the committed slot of each piece
    std::vector<uint8_t> live;  // ... and whether it holds anything (not all padding)
  };
  std::vector<Chunk> chunks;
  bool on_device = false;  // some chunk's state is on the device tier
};
StateSnapshot Snapshot(Engine::Impl& s);
// The gate keys of the snapshot's blocks (SaveGate::MemoryKey / SlotKey).
std::vector<uint64_t> GateKeys(const StateSnapshot& snap);

// Writes the snapshot's master, m and v into `tmp` (StateFileName of its rank), fsynced;
// their records (path relative to the checkpoint, size, checksums) go to *files, in kind
// order. Each block is released from `gate` once read (all of them when it returns).
// Buffers: the streams' and two NVMe pieces, from `arena` when it has room.
Status WriteStateFiles(const StateSnapshot& snap, IoEngine& io, HostArena* arena, const std::string& tmp,
                       zero::SaveGate& gate, std::vector<CheckpointFileInfo>* files);

// A save between StartCheckpoint and FinishCheckpoint.
struct PendingSave {
  std::string dir, tmp, what;
  Manifest manifest;  // all but the file records, as of the step saved
  std::vector<CheckpointFileInfo> files;
  std::unique_ptr<IoEngine> own_io;
  std::shared_future<Status> written;  // this rank's files (OK at once when it has none)
  std::chrono::steady_clock::time_point start;
  double started_s = 0;  // the training thread's time in StartCheckpoint
};

// The three state files a rank loads from, opened and size-checked before anything of
// the engine changes.
struct StateReaders {
  std::array<std::unique_ptr<FileReader>, kStateKinds> reader;
  std::array<const CheckpointFileInfo*, kStateKinds> record{};
};
// `source_rank`'s files of the checkpoint at `dir`: NotFound naming the file and rank
// when one is missing, Corruption when its size is not the manifest's.
Result<StateReaders> OpenStateFiles(Engine::Impl& s, IoEngine& io, const std::string& dir, const Manifest& m,
                                    int source_rank);
// Streams every chunk from the files into the engine's optimizer state tier, checking
// each chunk's checksum (Corruption naming file, chunk and byte range) and each file's.
Status RestoreState(Engine::Impl& s, StateReaders& files);
// The same from a checkpoint of another layout, through a verified source
// (ReshardSource::Verify).
Status RestoreResharded(Engine::Impl& s, ReshardSource& source);

}  // namespace strata::ckpt
