#include "cli/auto_plan.h"

#include <chrono>
#include <cstdio>

#include "cli/commands.h"
#include "cli/plan_text.h"
#include "strata/units.h"
#include "tools/planner.h"

namespace strata::cli {
namespace {

// What rank 0 sends: how its plan went, and the choice.
struct Choice {
  float outcome = 0;  // 0: planned, 1: nothing fits, 2: planning failed
  float stage = 0, opt = 0, param = 0, overlap = 0;
  float device_chunks = 0,
        chunks = 0;  // a CPU optimizer's chunks kept on the device (offload_optimizer.ratio)
};

std::string Describe(const tools::PlanCandidate& c) {
  return c.name + ", overlap " + (c.config.strata.overlap ? "on" : "off") + ": " +
         FormatSeconds(c.predicted_s) + " a step (waits on " + c.critical_lane + ")";
}

// Rank 0's plan; prints it, or sets `failure` to why there is no choice.
Choice PlanOnRankZero(const Communicator& world, const tools::PlanModel& model, const Config& config,
                      Status* failure) {
  tools::PlanRequest r;
  r.base = config;
  r.model = model;
  r.world_size = world.size();
  r.micro_batch = config.train_micro_batch_size_per_gpu;
  r.process_base = tools::MeasureProcessBase();  // before the probes' buffers
  const auto t0 = std::chrono::steady_clock::now();
  Result<tools::LaneRates> rates = tools::MeasurePlanRates(r);
  Result<std::vector<tools::PlanCandidate>> all = rates.status();
  if (rates.ok()) {
    r.rates = *rates;
    all = tools::PlanConfigurations(r);
  }
  if (!all.ok()) {
    *failure = all.status().WithContext("--config auto");
    return {2};
  }
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const tools::PlanCandidate& best = all->front();
  if (!best.fits) {
    std::string why;
    for (const tools::PlanCandidate& c : *all)
      if (c.valid) why += "\n  " + c.name + ": " + RefusalSummary(c.refusal);
    *failure = OutOfBudgetError("--config auto: no configuration fits the budgets:" + why);
    return {1};
  }
  int fitting = 0;
  for (const tools::PlanCandidate& c : *all) fitting += c.fits;
  std::fprintf(stderr, "strata: --config auto: %s, of %d configurations that fit %s (planned in %.1f s)\n",
               Describe(best).c_str(), fitting, tools::ChoiceReason(*all).c_str(), took);
  for (size_t i = 1; i < all->size() && i < 3 && (*all)[i].fits; ++i)
    std::fprintf(stderr, "strata:   next: %s\n", Describe((*all)[i]).c_str());
  std::fprintf(stderr, "strata:   the same as %s; `strata plan` shows every configuration\n",
               ChoiceFlags(best.config).c_str());
  return {0,
          static_cast<float>(best.config.zero.stage),
          static_cast<float>(best.config.zero.offload_optimizer.device),
          static_cast<float>(best.config.zero.offload_param.device),
          best.config.strata.overlap ? 1.0f : 0.0f,
          static_cast<float>(best.layout.optimizer_device_chunks),
          static_cast<float>(best.layout.num_chunks)};
}

}  // namespace

void ApplyAutoPlan(Communicator& world, const tools::PlanModel& model, Config* config,
                   std::map<std::string, std::string>* origin) {
  Choice c;
  Status failure;
  if (world.rank() == 0) c = PlanOnRankZero(world, model, *config, &failure);
  // Small integers, exact in fp32; every rank then makes the same config from them.
  ThrowIfError(world.Broadcast(&c, sizeof(Choice) / sizeof(float), DType::kF32, 0).Wait());
  if (c.outcome != 0) {
    if (world.rank() == 0) throw CliError(failure);
    throw CliError(AbortedError("--config auto: rank 0 could not plan this run (it says why)"));
  }
  *config = tools::CandidateConfig(*config, static_cast<int>(c.stage),
                                   static_cast<OffloadDevice>(static_cast<int>(c.opt)),
                                   static_cast<OffloadDevice>(static_cast<int>(c.param)));
  config->strata.overlap = c.overlap != 0;
  config->strata.overlap_auto = false;
  if (c.device_chunks > 0) {
    // Every rank lays the model out alike: the same count of chunks gives the same ratio.
    const int n = static_cast<int>(c.chunks);
    config->zero.offload_optimizer.ratio = static_cast<double>(n - static_cast<int>(c.device_chunks)) / n;
    (*origin)["zero_optimization.offload_optimizer.ratio"] = "--config auto: strata plan's first choice";
  }
  (*origin)["zero_optimization.stage"] = "--config auto: strata plan's first choice";
}

}  // namespace strata::cli
