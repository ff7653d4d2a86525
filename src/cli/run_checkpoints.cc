#include "cli/run_checkpoints.h"

#include <filesystem>
#include <utility>

#include "strata/units.h"

namespace strata::cli {
namespace {

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

Result<std::string> FindCheckpoint(const SaveSettings& s) {
  namespace fs = std::filesystem;
  if (s.resume == "auto") {
    auto latest = LatestCheckpoint(s.save_dir);
    if (latest.status().code() == StatusCode::kNotFound) return std::string();
    return latest;
  }
  std::error_code ec;
  if (fs::exists(fs::path(s.resume) / "manifest.json", ec)) return s.resume;
  return LatestCheckpoint(s.resume);
}

}  // namespace

Status CheckSaveSettings(const SaveSettings& s, const std::string& init_from) {
  if (s.save_every < 0 || s.keep < 1) {
    return InvalidArgumentError("--save-every must be at least 0 and --keep at least 1");
  }
  if (s.save_dir.empty() && (s.save_every > 0 || s.resume == "auto")) {
    return InvalidArgumentError(std::string(s.save_every > 0 ? "--save-every" : "--resume auto") +
                                " needs --save DIR: the directory the checkpoints go to");
  }
  if (!init_from.empty() && !s.resume.empty() && s.resume != "auto") {
    return InvalidArgumentError("--init-from and --resume " + s.resume +
                                ": a resume restores the checkpoint's weights and optimizer state; give one "
                                "(--resume auto starts from --init-from when there is no checkpoint yet)");
  }
  return OkStatus();
}

Result<ResumePoint> Resume(Engine& engine, const SaveSettings& s, const nlohmann::json& identity) {
  ResumePoint p;
  if (s.resume.empty()) return p;
  STRATA_ASSIGN_OR_RETURN(p.dir, FindCheckpoint(s));
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
  STRATA_RETURN_IF_ERROR(CheckSameRun(saved, identity, p.dir));
  p.next_step = meta.step_calls;
  p.applied = meta.optimizer_steps;
  return p;
}

std::string ResumeLine(const ResumePoint& p, int world_size, int stage) {
  std::string line = "resumed from " + p.dir + " after " + std::to_string(p.next_step) + " steps";
  if (p.saved_world != world_size || p.saved_stage != stage) {
    line += " (saved by " + std::to_string(p.saved_world) + (p.saved_world == 1 ? " rank" : " ranks") +
            " at stage " + std::to_string(p.saved_stage) + ", loaded by " + std::to_string(world_size) +
            " at stage " + std::to_string(stage) + ")";
  }
  return line;
}

RunSaver::RunSaver(Engine& engine, const SaveSettings& s, nlohmann::json identity, int steps, int rank,
                   std::function<void(const nlohmann::json& line)> report)
    : engine_(engine),
      s_(s),
      identity_(std::move(identity)),
      steps_(steps),
      rank_(rank),
      report_(std::move(report)) {}

Status RunSaver::AfterStep(int done, int64_t applied) {
  STRATA_RETURN_IF_ERROR(Finish());  // the one started a step ago
  const bool due = done == steps_ || (s_.save_every > 0 && done % s_.save_every == 0);
  if (s_.save_dir.empty() || !due) return OkStatus();
  nlohmann::json state = identity_;
  state["steps_done"] = done;
  state["applied"] = applied;
  CheckpointMeta meta;
  meta.json = state.dump();
  STRATA_RETURN_IF_ERROR(engine_.StartCheckpoint(CheckpointPath(s_.save_dir, done), meta));
  saving_ = done;
  return OkStatus();
}

Status RunSaver::Finish() {
  if (saving_ < 0) return OkStatus();
  const int done = saving_;
  saving_ = -1;
  STRATA_ASSIGN_OR_RETURN(const CheckpointTimes t, engine_.FinishCheckpoint());
  if (rank_ == 0) STRATA_RETURN_IF_ERROR(KeepNewestCheckpoints(s_.save_dir, s_.keep));
  if (report_) {
    report_({{"step", done},
             {"checkpoint", CheckpointPath(s_.save_dir, done)},
             {"save_s", t.total_s},
             {"stall_s", t.stalled_s()}});
  }
  return OkStatus();
}

std::string SaveLine(const nlohmann::json& line) {
  return "checkpoint " + line["checkpoint"].get<std::string>() + " saved in " +
         FormatSeconds(line["save_s"].get<double>()) + ", written behind training (training waited " +
         FormatSeconds(line["stall_s"].get<double>()) + ")";
}

}  // namespace strata::cli
