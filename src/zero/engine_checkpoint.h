// The engine's side of checkpoints (Engine::SaveCheckpoint / LoadCheckpoint): the
// agreement between ranks, and streaming each rank's optimizer state between its tier
// and the checkpoint files. engine_checkpoint.cc saves, engine_checkpoint_load.cc loads,
// engine_checkpoint_state.cc moves the bytes.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "strata/checkpoint.h"
#include "zero/checkpoint_manifest.h"
#include "zero/checkpoint_reshard.h"
#include "zero/checkpoint_stream.h"
#include "zero/engine_impl.h"

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

// Writes this rank's master, m and v into `tmp` (StateFileName), fsynced; their records
// (path relative to the checkpoint, size, checksums) go to *files, in kind order.
Status WriteStateFiles(Engine::Impl& s, IoEngine& io, const std::string& tmp,
                       std::vector<CheckpointFileInfo>* files);

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
