// The GPT job's checkpoints: what the loop adds to the engine's state (its position, the
// schedule's count, what must not change across a resume), where a resume starts, and a
// save with the old ones pruned. Collective: every rank calls each function.
#pragma once

#include <cstdint>
#include <string>

#include "cli/gpt_train_job.h"
#include "strata/checkpoint.h"
#include "strata/engine.h"
#include "strata/token_data.h"

namespace strata::cli {

struct ResumePoint {
  std::string dir;        // the checkpoint loaded; empty: a fresh start
  int64_t next_step = 0;  // the run's steps done so far
  int64_t applied = 0;    // of those, optimizer steps applied (the schedule's count)
  int saved_world = 0;    // the ranks and stage that saved it (a load reshards
  int saved_stage = 0;    // what another world size or sharding laid out)
};

// Loads the checkpoint job.resume names (a checkpoint directory, a directory of them: its
// newest, or "auto": the newest under job.save_dir, a fresh start when there is none).
// InvalidArgument naming the setting that differs from the saved run's (model, sequence
// length, data seed or training file), else the errors of Engine::LoadCheckpoint.
Result<ResumePoint> Resume(Engine& engine, const GptTrainJob& job, const model::TokenFile& train);

// Starts saving the state after `done` steps (`applied` of them applied) into
// CheckpointPath(job.save_dir, done); the files are written while training goes on.
Status StartSave(Engine& engine, const GptTrainJob& job, const model::TokenFile& train, int64_t done,
                 int64_t applied);
// Finishes the save StartSave began (call it after the next step, or at the end) and
// keeps the newest job.keep (rank 0 prunes). Returns where training waited for it.
Result<CheckpointTimes> FinishSave(Engine& engine, const GptTrainJob& job, int rank);

}  // namespace strata::cli
