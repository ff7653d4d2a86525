// A training run's checkpoints, for either model of `strata train`: where a resume
// starts (and that it continues the same run), and the saves along the run, each
// started after its step and finished after the next one, so that the files are written
// while that step trains. Collective: every rank makes the same calls.
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>

#include "strata/checkpoint.h"
#include "strata/engine.h"

namespace strata::cli {

// --save DIR --save-every N --keep K --resume DIR|auto.
struct SaveSettings {
  std::string save_dir;  // checkpoints; empty: none
  int save_every = 0;    // 0: after the last step only
  int keep = 2;
  std::string resume;  // a checkpoint, a --save directory, or "auto"; empty: fresh start
};

// InvalidArgument naming the flag: --save-every below 0, --keep below 1, --save-every or
// --resume auto without --save, and --init-from (`init_from`, empty when not given)
// beside a --resume of a checkpoint.
Status CheckSaveSettings(const SaveSettings& s, const std::string& init_from = "");

struct ResumePoint {
  std::string dir;        // the checkpoint loaded; empty: a fresh start
  int64_t next_step = 0;  // the run's steps done so far
  int64_t applied = 0;    // of those, optimizer steps applied (the schedule's count)
  int saved_world = 0;    // the ranks and stage that saved it (a load reshards
  int saved_stage = 0;    // what another world size or sharding laid out)
};

// Loads the checkpoint s.resume names (a checkpoint directory, a directory of them: its
// newest, or "auto": the newest under s.save_dir, a fresh start when there is none).
// `identity` is what the run must share with the saved one (model, data, sequence):
// InvalidArgument naming the setting that differs, else the errors of
// Engine::LoadCheckpoint.
Result<ResumePoint> Resume(Engine& engine, const SaveSettings& s, const nlohmann::json& identity);

// "resumed from DIR after N steps", and who saved it when that was another world size or
// stage than this run's.
std::string ResumeLine(const ResumePoint& p, int world_size, int stage);

// The saves of one run of `steps` steps: after every s.save_every steps and after the
// last, into CheckpointPath(s.save_dir, done), keeping the newest s.keep (rank 0 prunes).
class RunSaver {
 public:
  // `report` gets each finished save's line (step, checkpoint, save_s, stall_s) on every
  // rank; it may be empty.
  RunSaver(Engine& engine, const SaveSettings& s, nlohmann::json identity, int steps, int rank,
           std::function<void(const nlohmann::json& line)> report);
  // After step `done` (`applied` of the run's steps applied): finishes the save started
  // after the step before, then starts one if it is due.
  Status AfterStep(int done, int64_t applied);
  // Finishes the save still in progress (after the last step).
  Status Finish();

 private:
  Engine& engine_;
  const SaveSettings& s_;
  nlohmann::json identity_;
  int steps_ = 0, rank_ = 0;
  std::function<void(const nlohmann::json& line)> report_;
  int saving_ = -1;  // the steps done of the save in progress; -1: none
};

// The text line of a finished save that `report` got.
std::string SaveLine(const nlohmann::json& line);

}  // namespace strata::cli
