// The GPT job's checkpoints: what the loop adds to the engine's state (its position, the
// schedule's count, what must not change across a resume), where a resume starts, and a
// save with the old ones pruned. Collective: every rank calls each function.
#pragma once

#include <cstdint>
#include <string>

#include "cli/gpt_train_job.h"
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

// Saves after `done` steps (`applied` of them applied) into
// CheckpointPath(job.save_dir, done) and keeps the newest job.keep (rank 0 prunes).
// Returns the seconds training stood still for it.
Result<double> Save(Engine& engine, const GptTrainJob& job, const model::TokenFile& train, int64_t done,
                    int64_t applied, int rank);

}  // namespace strata::cli
