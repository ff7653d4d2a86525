#include "cli/train_job.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <set>

#include "cli/commands.h"
#include "cli/run_setup.h"
#include "strata/swap_files.h"
#include "strata/units.h"
#include "tools/model_engine.h"
#include "tools/plan_model.h"
#include "tools/process_memory.h"
#include "tools/step_bench.h"
#include "zero/trainer.h"

namespace strata::cli {
namespace {

// What was configured, before the first step (rank 0).
void PrintSummary(const TrainJob& job, const EngineLayoutInfo& l, int world_size) {
  std::printf("strata train: reference MLP, %s parameters (%zu hidden layers of %lld), %d chunks of %s\n",
              FormatCount(static_cast<double>(l.num_params)).c_str(), job.model.hidden.size(),
              static_cast<long long>(job.model.hidden.empty() ? 0 : job.model.hidden[0]), l.num_chunks,
              FormatBytes(static_cast<uint64_t>(l.chunk_elems) * 4).c_str());
  PrintConfigSummary(job.config, job.origin, l, world_size, "samples");
}

nlohmann::json Report(const TrainJob& job, const EngineLayoutInfo& l, const zero::TrainLog& log,
                      int world_size, int first_step) {
  nlohmann::json steps = nlohmann::json::array();
  for (size_t i = 0; i < log.losses.size(); ++i) {
    steps.push_back({{"step", first_step + i + 1},
                     {"loss", log.losses[i]},
                     {"seconds", log.timing[i].total_s()},
                     {"loss_scale", log.loss_scales[i]},
                     {"skipped", static_cast<bool>(log.skipped[i])},
                     {"grad_norm", log.results[i].grad_norm},
                     {"overlapped", log.results[i].overlapped}});
  }
  return {{"config", ConfigToJson(job.config)},
          {"world_size", world_size},
          {"model", {{"params", l.num_params}, {"chunks", l.num_chunks}, {"hidden", job.model.hidden}}},
          {"budget_need", {{"device", l.device_need}, {"host", l.host_need}, {"nvme", l.nvme_need}}},
          {"peak_rss_bytes", tools::PeakRssBytes()},
          {"steps", steps}};
}

}  // namespace

int RunTrainJob(Communicator& world, const TrainJob& job, InterruptGuard& guard) {
  const bool rank0 = world.rank() == 0;
  StartRun(world, job.config, guard);
  const uint64_t base_rss = tools::MeasureProcessBase();  // before the engine and the model
  auto setup = tools::CreateMlpEngine(world, job.config, job.model, job.config.train_micro_batch_size_per_gpu,
                                      nullptr);
  if (!setup.ok()) return EndFailedRun(setup.status(), guard);
  const EngineLayoutInfo layout = setup->engine->layout_info();
  if (rank0 && !job.json) PrintSummary(job, layout, world.size());
  // What a resumed run must share with the saved one to continue it bit for bit.
  const nlohmann::json identity = {{"model",
                                    {{"input_dim", job.model.input_dim},
                                     {"hidden", job.model.hidden},
                                     {"output_dim", job.model.output_dim},
                                     {"seed", job.model.seed}}},
                                   {"data_seed", job.data_seed}};
  auto from = Resume(*setup->engine, job.save, identity);
  if (!from.ok()) return EndFailedRun(from.status(), guard);
  if (rank0 && !job.json && !from->dir.empty())
    std::printf("%s\n", ResumeLine(*from, world.size(), job.config.zero.stage).c_str());
  RunSaver saver(*setup->engine, job.save, identity, job.steps, world.rank(),
                 [&](const nlohmann::json& line) {
                   if (rank0 && !job.json) std::printf("%s\n", SaveLine(line).c_str());
                 });
  zero::TrainSpec spec;
  spec.model = job.model;
  spec.data.seed = job.data_seed;
  spec.steps = job.steps;
  spec.micro_batch = job.config.train_micro_batch_size_per_gpu;
  spec.check_stop = [&guard] { return guard.Check(); };
  spec.first_step = static_cast<int>(from->next_step);
  spec.first_applied = from->applied;
  spec.after_step = [&saver](int done, int64_t applied) { return saver.AfterStep(done, applied); };
  StepProgress progress(job.steps, job.config.train_batch_size, "samples", job.config.fp16.enabled);
  std::function<void(const zero::TrainLog&)> on_step;
  if (rank0 && !job.json) {
    on_step = [&](const zero::TrainLog& log) {
      const size_t i = log.losses.size() - 1;
      const std::string line = progress.Line(spec.first_step + static_cast<int>(i), log.losses[i], log.lrs[i],
                                             log.timing[i].total_s(), log.results[i]);
      std::printf("%s\n", line.c_str());
      std::fflush(stdout);
    };
  }
  auto log = zero::TrainWithEngine(*setup->engine, world, job.config, spec, on_step);
  if (log.ok()) {
    Status saved = saver.Finish();
    if (!saved.ok()) log = saved;
  }
  if (!log.ok()) {
    setup->engine.reset();  // closes the stores: their swap and lock files go
    return EndFailedRun(log.status(), guard);
  }
  if (rank0 && job.json)
    std::printf("%s\n", Report(job, layout, *log, world.size(), spec.first_step).dump(2).c_str());
  if (rank0 && !job.json && log->losses.empty()) {
    std::printf("done: the checkpoint was already at step %d of %d\n", spec.first_step, job.steps);
  } else if (rank0 && !job.json) {
    double sum = 0;
    for (size_t i = log->timing.size() > 1 ? 1 : 0; i < log->timing.size(); ++i)
      sum += log->timing[i].total_s();
    const size_t timed = log->timing.size() > 1 ? log->timing.size() - 1 : 1;
    std::printf("done: %d steps, %s per step after the first, final loss %.6f\n", job.steps,
                FormatSeconds(sum / timed).c_str(), log->losses.back());
    std::printf(
        "%s\n",
        MemoryAccountLine(layout, job.config, base_rss, tools::MlpActivationBytes(job.model)).c_str());
  }
  return 0;
}

}  // namespace strata::cli
