#include "cli/gpt_checkpoints.h"

#include <filesystem>
#include <nlohmann/json.hpp>

#include "strata/checkpoint.h"

namespace strata::cli {
namespace {

// What a resumed run must share with the saved one to continue it bit for bit.
nlohmann::json RunIdentity(const GptTrainJob& job, const model::TokenFile& train) {
  const model::GptSpec& m = job.model;
  return {{"model",
           {{"vocab_size", m.vocab_size},
            {"block_size", m.block_size},
            {"n_layer", m.n_layer},
            {"n_head", m.n_head},
            {"n_embd", m.n_embd},
            {"tied_head", m.tied_head},
            {"seed", m.seed}}},
          {"seq", job.seq},
          {"data_seed", job.data_seed},
          {"train_tokens", train.size()}};
}

Status CheckSameRun(const nlohmann::json& saved, const nlohmann::json& now, const std::string& dir) {
  for (const auto& [key, value] : now.items()) {
    if (!saved.contains(key)) return CorruptionError(dir + ": its run state has no \"" + key + "\"");
    if (saved[key] != value) {
      return InvalidArgumentError(dir + ": saved by a run with " + key + " " + saved[key].dump() +
                                  ", this run has " + value.dump() +
                                  "; resume with the saved run's settings (or start afresh)");
    }
  }
  return OkStatus();
}

Result<std::string> FindCheckpoint(const GptTrainJob& job) {
  namespace fs = std::filesystem;
  if (job.run.resume == "auto") {
    auto latest = LatestCheckpoint(job.run.save_dir);
    if (latest.status().code() == StatusCode::kNotFound) return std::string();
    return latest;
  }
  std::error_code ec;
  if (fs::exists(fs::path(job.run.resume) / "manifest.json", ec)) return job.run.resume;
  return LatestCheckpoint(job.run.resume);
}

}  // namespace

Result<ResumePoint> Resume(Engine& engine, const GptTrainJob& job, const model::TokenFile& train) {
  ResumePoint p;
  if (job.run.resume.empty()) return p;
  STRATA_ASSIGN_OR_RETURN(p.dir, FindCheckpoint(job));
  if (p.dir.empty()) return p;
  STRATA_ASSIGN_OR_RETURN(CheckpointInfo info, ReadCheckpointInfo(p.dir));
  p.saved_world = info.world_size;
  p.saved_stage = info.stage;
  CheckpointMeta meta;
  STRATA_RETURN_IF_ERROR(engine.LoadCheckpoint(p.dir, &meta));
  nlohmann::json saved;
  try {
    saved = nlohmann::json::parse(meta.json);
  } catch (const nlohmann::json::exception& e) {
    return CorruptionError(p.dir + ": the run state in its manifest does not parse: " + e.what());
  }
  STRATA_RETURN_IF_ERROR(CheckSameRun(saved, RunIdentity(job, train), p.dir));
  p.next_step = meta.step_calls;
  p.applied = meta.optimizer_steps;
  return p;
}

Status StartSave(Engine& engine, const GptTrainJob& job, const model::TokenFile& train, int64_t done,
                 int64_t applied) {
  nlohmann::json state = RunIdentity(job, train);
  state["steps_done"] = done;
  state["applied"] = applied;
  CheckpointMeta meta;
  meta.json = state.dump();
  return engine.StartCheckpoint(CheckpointPath(job.run.save_dir, done), meta);
}

Result<CheckpointTimes> FinishSave(Engine& engine, const GptTrainJob& job, int rank) {
  STRATA_ASSIGN_OR_RETURN(CheckpointTimes times, engine.FinishCheckpoint());
  if (rank == 0) STRATA_RETURN_IF_ERROR(KeepNewestCheckpoints(job.run.save_dir, job.run.keep));
  return times;
}

}  // namespace strata::cli
