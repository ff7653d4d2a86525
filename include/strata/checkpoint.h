// Checkpoints of an Engine's training state: what Engine::SaveCheckpoint writes and
// Engine::LoadCheckpoint reads (engine.h), and the helpers a training loop needs around
// them (where to save, which checkpoint to resume, how many to keep).
//
// A training loop (the whole integration):
//   after Step() of step s, every --save-every N steps, on every rank:
//     CheckpointMeta meta{.json = loop_state.dump()};   // data position, lr step, seeds, ...
//     st = engine->StartCheckpoint(CheckpointPath(parent, s + 1), meta);  // collective
//   after the next Step() (the files are written meanwhile):
//     times = engine->FinishCheckpoint();                                 // collective
//     if (times.ok() && rank == 0) KeepNewestCheckpoints(parent, keep);
//   (SaveCheckpoint does both at once.)
//   to resume, after Engine::Create and before the first micro-batch, on every rank:
//     dir = LatestCheckpoint(parent)  (or the directory the user names)
//     engine->LoadCheckpoint(*dir, &meta);  // collective; meta.json is the loop's state
// A failed save leaves the engine as it was (training may go on) and the previous
// checkpoints intact.
//
// Directory DIR (one per checkpoint):
//   manifest.json             written last, by rank 0: format "strata-checkpoint",
//                             version, world size, stage, layout (every tensor's name,
//                             shape, chunk and offset), the engine's scalar state (optimizer
//                             steps, loss scaler, learning rate, recorded call order), every
//                             file with its size and XXH3 (whole file and per chunk), the
//                             engine config and the caller's meta.
//   master-rNNNNN.bin         fp32 master shard of rank NNNNN, every chunk in order,
//   exp_avg-rNNNNN.bin        Adam m, and
//   exp_avg_sq-rNNNNN.bin     Adam v: raw little-endian fp32, chunk c at c * chunk_bytes
//                             (the rank's shard of the chunk, 4 KiB aligned). Stage 0
//                             keeps replicas: rank 0 alone writes them.
// A save writes into DIR.tmp-<16 hex digits>, fsyncs every file and the directory,
// writes the manifest, then renames the directory to DIR (exchanging it atomically with
// an older checkpoint of that name) and fsyncs the parent: a crash at any point leaves
// DIR as it was (the previous checkpoint, or nothing) and a .tmp- directory that the next
// save into DIR, or KeepNewestCheckpoints, removes. The compute parameters are not
// saved: they are the master rounded to the compute dtype, which a load republishes.
// Host memory: each state file streams through two 4 MiB buffers, so a save adds 24 MiB
// whatever the model size (NVMe state passes through the engine's own staging sets); a
// load adds the same and, while it republishes, one chunk shard's master and compute copy.
// docs/checkpoints.md says why the layout and the protocol are as they are.
//
// Threads: the functions here may be called from any thread; they do file I/O only.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "strata/dtype.h"
#include "strata/status.h"

namespace strata {

struct CheckpointMeta {
  // The training loop's own state, one JSON document (config, model spec, data
  // position, learning-rate schedule step, RNG seeds, ...): SaveCheckpoint stores it in
  // the manifest (InvalidArgument when it does not parse), LoadCheckpoint returns it
  // (re-serialized: the same document, not necessarily the same bytes).
  std::string json = "{}";
  // Filled by LoadCheckpoint (ignored by SaveCheckpoint, which records the engine's):
  // Step() calls the saved state has seen over the whole run, resumed parts included
  // (the next step's index), and of those the optimizer steps taken (fp16 overflow
  // skips excluded; Adam's bias correction counts these).
  int64_t step_calls = 0;
  int64_t optimizer_steps = 0;
};

// Where training waited for a save (Engine::FinishCheckpoint), in seconds.
struct CheckpointTimes {
  double started_s = 0;         // the training thread in StartCheckpoint (Flush, snapshot)
  double finish_wait_s = 0;     // FinishCheckpoint waiting for this rank's files
  double optimizer_wait_s = 0;  // the optimizer waiting for blocks the save had not read
  double total_s = 0;           // from StartCheckpoint to the checkpoint in place
  // What the save cost training at most (the optimizer's waits may overlap the backward).
  double stalled_s() const { return started_s + finish_wait_s + optimizer_wait_s; }
};

// "<parent>/step-<step, 9 digits>": the name CheckpointPath gives, which sorts by step.
std::string CheckpointPath(const std::string& parent, int64_t step);

// The complete checkpoint under `parent` (its subdirectories with a manifest.json that
// parses) whose state has seen the most Step() calls, names breaking ties; unfinished
// saves (.tmp- directories) are ignored. NotFound when there is none; IoError when
// `parent` cannot be listed.
Result<std::string> LatestCheckpoint(const std::string& parent);

// Removes, under `parent`, every complete checkpoint but the `keep` newest (ordered as
// LatestCheckpoint orders them) and every unfinished save left by a crash (a directory
// named <name>.tmp-<16 hex digits>); nothing else is touched. keep >= 1
// (InvalidArgument otherwise). Call it on one rank, after SaveCheckpoint returned OK on
// every rank, so the newest is complete before anything is removed; not while another
// process saves under `parent`.
Status KeepNewestCheckpoints(const std::string& parent, int keep);

// A checkpoint's manifest, summarised (for `strata ckpt info`).
struct CheckpointFileInfo {
  std::string path;  // relative to the checkpoint directory
  int rank = 0;
  std::string kind;  // "master", "exp_avg", "exp_avg_sq"
  uint64_t bytes = 0;
  uint64_t xxh3 = 0;
  std::vector<uint64_t> chunk_xxh3;  // per chunk, of its chunk_bytes
};
struct CheckpointInfo {
  int version = 0;
  int world_size = 0;
  int stage = 0;
  int state_ranks = 0;  // ranks whose files hold the state (1 at stage 0)
  std::string compute_dtype;
  std::string offload_optimizer, offload_param;  // where the saving engine kept them
  int64_t num_params = 0;
  int64_t num_tensors = 0;
  int num_chunks = 0;
  int64_t chunk_elems = 0;
  int64_t shard_elems = 0;   // per rank and chunk, in the state files
  uint64_t chunk_bytes = 0;  // per chunk in each state file
  int64_t step_calls = 0;
  int64_t optimizer_steps = 0;
  double loss_scale = 1;
  double lr = 0;
  std::vector<CheckpointFileInfo> files;
  std::string meta_json;  // the caller's CheckpointMeta::json
};

// Reads and checks DIR/manifest.json (format, version, consistency of its fields). NotFound
// naming DIR when there is none (an unfinished save never has one); Corruption when it
// does not parse or misses a field; InvalidArgument for another format or version.
Result<CheckpointInfo> ReadCheckpointInfo(const std::string& dir);

// Reads every file of the checkpoint and checks its size and checksums against the
// manifest. Every file is read, and `report` (when set) gets one line per file; the
// Status is the first problem: NotFound for a missing file (naming it and its rank),
// Corruption for a wrong size or checksum (naming the file, the chunk and its byte
// range). Memory: two 4 MiB buffers.
Status VerifyCheckpoint(const std::string& dir,
                        const std::function<void(const std::string& line)>& report = {});

// Writes the checkpoint's weights (its fp32 master; each tensor of the layout once, so a
// tensor shared by several modules is one) to `out_path` as a safetensors file: header
// {"<tensor name>": {"dtype", "shape", "data_offsets"}, "__metadata__": {"format": "pt",
// "source", "step_calls", "optimizer_steps", "meta"}}, data in layout order (chunk,
// offset). dtype kF32 keeps the master's bits; kBf16 / kFp16 round to nearest even
// (half.h; fp16 beyond its range becomes inf). Any world size and stage; no engine.
// Memory: the master files stream through two 4 MiB buffers and a 2 MiB conversion
// buffer, plus the header (about 100 bytes per tensor): never the model.
// Each chunk's checksum (and each file's) is checked as it passes: Corruption naming the
// file and chunk, NotFound for a missing file, as ReadCheckpointInfo for the manifest,
// IoError naming `out_path` for the output. It is written to out_path + ".tmp", fsynced and
// renamed: a failed export leaves no .tmp and `out_path` as it was. `report` (when set)
// gets a line per master file read.
Status ExportSafetensors(const std::string& dir, const std::string& out_path, DType dtype,
                         const std::function<void(const std::string& line)>& report = {});

}  // namespace strata
