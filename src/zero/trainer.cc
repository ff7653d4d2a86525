#include "zero/trainer.h"

#include <chrono>
#include <cmath>
#include <cstring>

#include "strata/adam.h"
#include "strata/grad_stats.h"
#include "strata/half.h"
#include "strata/loss_scaler.h"
#include "strata/lr_schedule.h"
#include "strata/mlp_kernels.h"
#include "zero/adam_config.h"
#include "zero/timed_hooks.h"

namespace strata::zero {
namespace {

double Seconds(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

}  // namespace

Result<double> SumInRankOrder(Communicator& world, double value) {
  if (world.size() == 1) return value;
  // Each rank's value as the bits of a double (two floats' room).
  std::vector<double> all(world.size());
  STRATA_RETURN_IF_ERROR(world.AllGather(&value, all.data(), 2, DType::kF32).Wait());
  double sum = 0;
  for (double v : all) sum += v;
  return sum;
}

Result<TrainLog> TrainWithEngine(Engine& engine, Communicator& world, const Config& config,
                                 const TrainSpec& spec,
                                 const std::function<void(const TrainLog& log)>& on_step) {
  // The model computes where the engine keeps its parameters (CPU kernels on sim, CUDA
  // kernels on the engine's compute stream on a GPU).
  model::Mlp mlp(spec.model, engine.model_backend(), engine.model_stream());
  model::SyntheticData data(spec.model, spec.data);
  model::Batch batch;
  TrainLog log;
  const int accum = config.gradient_accumulation_steps;
  int64_t applied = spec.first_applied;  // the schedule advances on applied steps only, as DeepSpeed's
  for (int step = spec.first_step; step < spec.steps; ++step) {
    double loss = 0;
    const double lr = LearningRateAt(config.scheduler, applied, config.optimizer.lr);
    STRATA_RETURN_IF_ERROR(engine.SetLearningRate(lr));
    const double scale = engine.loss_scale();
    TimedHooks hooks(engine, spec.check_stop, spec.before_backward);
    StepTiming timing;
    if (spec.step_boundary) spec.step_boundary(step, /*end=*/false);
    auto t0 = std::chrono::steady_clock::now();
    for (int m = 0; m < accum; ++m) {
      if (spec.check_stop) STRATA_RETURN_IF_ERROR(spec.check_stop());
      model::BatchSlice slice{step, world.rank(), world.size(), m, accum, spec.micro_batch};
      STRATA_RETURN_IF_ERROR(data.Fill(slice, &batch));
      STRATA_RETURN_IF_ERROR(engine.BeginMicroBatch());
      // Dividing by G / scale multiplies the loss (and every gradient) by the loss scale.
      STRATA_ASSIGN_OR_RETURN(
          double l, mlp.ForwardBackward(batch, static_cast<double>(slice.GlobalBatchSize()) / scale, hooks));
      loss += l / scale;
    }
    auto t1 = std::chrono::steady_clock::now();
    STRATA_ASSIGN_OR_RETURN(StepResult r, engine.Step());
    // The last step's writes behind would finish after the loop: count them in its time.
    if (step + 1 == spec.steps) STRATA_RETURN_IF_ERROR(engine.Flush());
    timing.forward_backward_s = Seconds(t0, t1);
    timing.hooks_s = hooks.seconds();
    timing.model_wait_s = r.model_wait_s;
    timing.step_s = Seconds(t1, std::chrono::steady_clock::now());
    if (spec.step_boundary) spec.step_boundary(step, /*end=*/true);
    log.timing.push_back(timing);
    STRATA_ASSIGN_OR_RETURN(loss, SumInRankOrder(world, loss));
    log.losses.push_back(loss);
    log.lrs.push_back(lr);
    applied += r.skipped ? 0 : 1;
    log.skipped.push_back(r.skipped);
    log.loss_scales.push_back(r.loss_scale);
    log.clip_coefs.push_back(r.clip_coef);
    log.results.push_back(r);
    if (on_step) on_step(log);
    if (spec.after_step) STRATA_RETURN_IF_ERROR(spec.after_step(step + 1, applied));
  }
  return log;
}

namespace {

using Tensors = std::vector<std::vector<std::vector<float>>>;  // [module][tensor]

// The reference's state: the dense model, Adam's m and v and the window's gradient sum.
struct Reference {
  Reference(const Config& config, const TrainSpec& spec, DType compute)
      : mlp(spec.model),
        dense(spec.model, compute),
        data(spec.model, spec.data),
        adam(AdamFromConfig(config)) {
    for (int k = 0; k < dense.num_modules(); ++k) {
      m.emplace_back();
      v.emplace_back();
      acc.emplace_back();
      for (auto& t : dense.params(k)) {
        m.back().emplace_back(t.size(), 0.0f);
        v.back().emplace_back(t.size(), 0.0f);
        acc.back().emplace_back(t.size(), 0.0f);
      }
    }
  }
  model::Mlp mlp;
  model::DenseMlp dense;
  model::SyntheticData data;
  AdamParams adam;
  Tensors m, v, acc;
  model::Batch batch;
};

// One accumulation window's gradients summed into ref.acc; returns its loss. All ranks'
// micro-batch mb at once: one rank with a world_size times larger one. fp16 is the
// exception: a data-parallel rank's gradient is rounded to fp16 before the ranks'
// gradients are summed (where overflow shows), so the reference computes each rank's
// part separately, rounds it, and sums them in rank order.
Result<double> AccumulateWindow(Reference& ref, const Config& config, const TrainSpec& spec, int world_size,
                                int step, double scale, DType compute) {
  for (auto& mod : ref.acc) {
    for (auto& t : mod) std::fill(t.begin(), t.end(), 0.0f);
  }
  const int accum = config.gradient_accumulation_steps;
  const bool per_rank = compute == DType::kFp16;
  double loss = 0;
  for (int mb = 0; mb < accum; ++mb) {
    for (int r = 0; r < (per_rank ? world_size : 1); ++r) {
      model::BatchSlice slice = per_rank
                                    ? model::BatchSlice{step, r, world_size, mb, accum, spec.micro_batch}
                                    : model::BatchSlice{step, 0, 1, mb, accum, spec.micro_batch * world_size};
      STRATA_RETURN_IF_ERROR(ref.data.Fill(slice, &ref.batch));
      ref.dense.set_accumulate(false);
      STRATA_ASSIGN_OR_RETURN(
          double l, ref.mlp.ForwardBackward(ref.batch, static_cast<double>(slice.GlobalBatchSize()) / scale,
                                            ref.dense));
      loss += l / scale;
      for (int k = 0; k < ref.dense.num_modules(); ++k) {
        for (size_t t = 0; t < ref.acc[k].size(); ++t) {
          const auto& g = ref.dense.grads(k)[t];
          for (size_t i = 0; i < g.size(); ++i)
            ref.acc[k][t][i] += per_rank ? Fp16ToFloat(FloatToFp16(g[i])) : g[i];
        }
      }
    }
  }
  return loss;
}

}  // namespace

Result<ReferenceRun> TrainReference(const Config& config, const TrainSpec& spec, int world_size) {
  const DType compute = config.bf16 ? DType::kBf16 : config.fp16.enabled ? DType::kFp16 : DType::kF32;
  Reference ref(config, spec, compute);
  STRATA_ASSIGN_OR_RETURN(LossScaler scaler, LossScaler::Create(LossScalerOptions::FromConfig(config)));
  int64_t steps_taken = 0;
  ReferenceRun run;
  for (int step = 0; step < spec.steps; ++step) {
    const double scale = scaler.scale();
    STRATA_ASSIGN_OR_RETURN(const double loss,
                            AccumulateWindow(ref, config, spec, world_size, step, scale, compute));
    GradStats stats;
    for (auto& mod : ref.acc) {
      for (auto& t : mod) stats.Merge(ComputeGradStatsReference(GradView{t.data(), DType::kF32}, t.size()));
    }
    const bool overflow = stats.has_inf_nan;
    double clip = 1;
    const double norm = std::sqrt(stats.sum_sq) / scale;
    if (!overflow && config.gradient_clipping > 0) {
      const double c = config.gradient_clipping / (norm + 1e-6);
      if (c < 1) clip = c;
    }
    run.log.losses.push_back(loss);
    run.log.lrs.push_back(LearningRateAt(config.scheduler, steps_taken, config.optimizer.lr));
    run.log.skipped.push_back(overflow);
    run.log.loss_scales.push_back(scale);
    run.log.clip_coefs.push_back(clip);
    if (!overflow) {
      ref.adam.lr = static_cast<float>(run.log.lrs.back());
      ref.adam.step = ++steps_taken;
      ref.adam.grad_scale = clip == 1 ? scaler.grad_scale() : static_cast<float>(clip / scale);
      for (int k = 0; k < ref.dense.num_modules(); ++k) {
        for (size_t t = 0; t < ref.acc[k].size(); ++t) {
          auto& p = ref.dense.params(k)[t];
          STRATA_RETURN_IF_ERROR(AdamStepReference(ref.adam, p.data(), ref.m[k][t].data(), ref.v[k][t].data(),
                                                   GradView{ref.acc[k][t].data(), DType::kF32}, p.size()));
        }
      }
      ref.dense.SyncCompute();
    }
    STRATA_RETURN_IF_ERROR(scaler.Update(overflow));
  }
  for (int k = 0; k < ref.dense.num_modules(); ++k) run.params.push_back(ref.dense.params(k));
  return run;
}

}  // namespace strata::zero
