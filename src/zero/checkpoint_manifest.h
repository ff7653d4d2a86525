// The checkpoint manifest (checkpoint.h): its fields as a struct, and the JSON it is
// written as. Shared by the engine's save and load (engine_checkpoint*.cc), the
// directory helpers and VerifyCheckpoint.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "strata/checkpoint.h"
#include "strata/loss_scaler.h"
#include "strata/status.h"

namespace strata::ckpt {

inline constexpr char kFormat[] = "strata-checkpoint";
inline constexpr int kFormatVersion = 1;
inline constexpr char kManifestName[] = "manifest.json";

// The state files of a rank, in the order of a chunk's state (master | m | v).
inline constexpr int kStateKinds = 3;
inline constexpr const char* kKindNames[kStateKinds] = {"master", "exp_avg", "exp_avg_sq"};
// "master-r00003.bin".
std::string StateFileName(int kind, int rank);

struct TensorEntry {
  std::string name;
  std::vector<int64_t> shape;
  int chunk = 0;
  int64_t offset = 0;  // elements into its chunk
  int64_t numel = 0;
};

struct Manifest {
  CheckpointInfo info;
  std::vector<TensorEntry> tensors;
  LossScaler::State scaler;
  bool scaler_dynamic = false;  // a static scale is the config's, not restored
  // The engine's recorded call order (zero::ModuleUse as (kind, module)), replayed on
  // load so the first micro-batch after a resume schedules as the unbroken run's does.
  std::vector<std::pair<int, int>> call_order;
  std::string config_json;  // the saving engine's config (ConfigToJson)
};

// The manifest's JSON text. info.meta_json and config_json must be valid JSON.
std::string ManifestJson(const Manifest& m);
// Parses a manifest's text; `where` names it in errors. Corruption for text that does not
// parse or lacks a field, InvalidArgument for another format or a newer version.
Result<Manifest> ParseManifest(const std::string& text, const std::string& where);
// Reads DIR/manifest.json: NotFound naming DIR when it is missing, else as ParseManifest.
Result<Manifest> ReadManifest(const std::string& dir);

// The manifest's record of `rank`'s file of `kind`; nullptr when it has none.
const CheckpointFileInfo* FindFile(const CheckpointInfo& info, int rank, int kind);

// OK when `sum` is the manifest's checksum of `rec`'s chunk `chunk`; else Corruption
// naming the file at `path`, the chunk and its bytes, and both checksums.
Status CheckChunkChecksum(const std::string& path, const CheckpointFileInfo& rec, int chunk,
                          uint64_t chunk_bytes, uint64_t sum);

// Whether `text` parses as JSON (the caller's CheckpointMeta::json); the parser's
// message when it does not.
Status CheckJson(const std::string& text, const std::string& what);

}  // namespace strata::ckpt
