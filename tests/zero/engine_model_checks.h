// The bodies of the engine's model-agnostic interface tests, run at world size 1
// (engine_model_test) and under mpirun -np 2 and -np 4 (engine_model_mpi_test): chain
// models (chain_model.h) with shared tensors, recomputed blocks, frozen modules, modules
// called twice, a tensor larger than a chunk and a call order that changes, each trained
// by the engine and by a dense single-rank reference and compared.
//
// Tolerances: those of engine_checks.h, for the same reasons. The reference steps with
// the double-precision AdamStepReference and computes the global batch in one pass; the
// engine uses the SIMD fp32 Adam (a few ulps per step) and, at world > 1, sums per-rank
// partial gradients (another fp32 order), about 1e-7 relative per step each. A tensor
// shared by several modules, or a module called twice, adds its uses' gradients in the
// same order in both runs (the model adds them, in backward order). Over 4-5 steps with
// lr = 0.01 an update moves an element by at most ~lr, so atol 2e-5 + rtol 1e-4 is two
// orders above the expected error and two below one step, which any mistake in
// accumulation (a use dropped or counted twice, a stale or wrong parameter in a
// recompute) exceeds. Losses: rtol 1e-5. Gradient norms and clip coefficients: rtol
// 1e-4 (fp32 gradients ~1e-6 apart, the norm summed in another order), far below what a
// gradient counted twice or dropped changes. bf16: an ulp-level master difference can
// flip a 16-bit rounding (2^-8 relative), so losses at rtol 2e-3, norms at 1e-2 and
// parameters at atol 2 lr.
#pragma once

#include <chrono>
#include <cstdio>
#include <deque>
#include <functional>
#include <string>
#include <vector>

#include "chain_model.h"
#include "engine_harness.h"
#include "strata/adam.h"
#include "zero/adam_config.h"
#include "zero/layout.h"

namespace strata::testing {

inline constexpr double kChainAtol = 2e-5, kChainRtol = 1e-4, kChainLossRtol = 1e-5;
inline constexpr double kChain16LossRtol = 2e-3, kChain16Atol = 2 * 0.01;  // lr of MakeConfig
inline constexpr double kChainNormRtol = 1e-4, kChain16NormRtol = 1e-2;

struct ChainSetup {
  ModelDecl model;
  ChainProgramFn program;
  int steps = 4;
  int64_t micro_batch = 8;  // per rank
  uint64_t init_seed = 7, data_seed = 11;
  // Gradients handed in with Engine::AccumulateGrad, as code with its own autograd does,
  // instead of written into the buffers BeginBackward hands out.
  bool external_grads = false;
  // The learning rate of each step (its index); empty: optimizer.params.lr throughout.
  // The engine gets it by SetLearningRate before the step's first micro-batch.
  std::function<double(int step)> lr_at = nullptr;
};

// What a PyTorch integration does: the backward reads the parameters through Fetch and
// Release, writes its gradients into buffers of its own and hands each in.
class ExternalGradHooks : public ModuleHooks {
 public:
  ExternalGradHooks(Engine& engine, const ModelDecl& model) : engine_(engine), model_(model) {}
  Result<ModuleParams> Fetch(int m) override { return engine_.Fetch(m); }
  Status Release(int m) override { return engine_.Release(m); }
  Result<ModuleBackward> BeginBackward(int m) override {
    STRATA_ASSIGN_OR_RETURN(ModuleParams params, engine_.Fetch(m));
    ModuleBackward b{std::move(params), {}};
    grads_.clear();
    for (TensorId id : model_.modules[m].tensors) {
      grads_.emplace_back(model_.tensors[id].numel(), 0.0f);
      b.grads.tensors.push_back(grads_.back().data());
      b.grads.accumulate.push_back(0);
    }
    return b;
  }
  Status EndBackward(int m) override {
    STRATA_RETURN_IF_ERROR(engine_.Release(m));
    for (size_t i = 0; i < grads_.size(); ++i) {
      STRATA_RETURN_IF_ERROR(
          engine_.AccumulateGrad(model_.modules[m].tensors[i], grads_[i].data(), DType::kF32));
    }
    return OkStatus();
  }

 private:
  Engine& engine_;
  const ModelDecl& model_;
  std::deque<std::vector<float>> grads_;
};

struct ChainRun {
  Status status;
  std::vector<double> losses, grad_norms, clip_coefs;
  std::vector<double> eval_losses;         // GPT runs with GptSetup::evaluate
  std::vector<double> model_waits;         // StepResult::model_wait_s (GPT engine runs)
  std::vector<std::vector<float>> params;  // final fp32 masters, by tensor id
  uint64_t device_high_water = 0, device_capacity = 0;
  EngineLayoutInfo layout;                // engine runs only
  Backend model_backend = Backend::kCpu;  // where the model's kernels ran (engine runs)
};

inline ChainRun FailedRun(Status status) {
  ChainRun run;
  run.status = std::move(status);
  return run;
}

// Ends an engine run: after `trained`, waits for the writes behind the last step and
// gathers the masters of the `tensors` tensors (collective); the device's figures.
inline ChainRun FinishRun(ChainRun run, Status trained, Engine& e, Device& dev, size_t tensors) {
  run.status = trained;
  if (run.status.ok()) run.status = e.Flush();
  for (size_t t = 0; t < tensors && run.status.ok(); ++t) {
    run.params.emplace_back();
    run.status = e.GatherMaster(static_cast<TensorId>(t), &run.params.back());
  }
  run.device_high_water = dev.high_water();
  run.device_capacity = dev.capacity();
  run.layout = e.layout_info();
  run.model_backend = e.model_backend();
  return run;
}

// One training step of `setup` with the engine on this rank's slices of the data: the
// window's micro-batches, Step(), and the global loss (every rank calls it).
class ChainStepper {
 public:
  ChainStepper(Communicator& world, Engine& engine, const ChainSetup& setup)
      : world_(world), e_(engine), setup_(setup), driver_(setup.model), external_(engine, setup.model) {}

  Result<StepResult> Step(const Config& config, int step, double* loss) {
    ModuleHooks& hooks = setup_.external_grads ? static_cast<ModuleHooks&>(external_) : e_;
    const int accum = config.gradient_accumulation_steps;
    const double scale = e_.loss_scale();
    double sum = 0;
    for (int mb = 0; mb < accum; ++mb) {
      const model::BatchSlice slice{step, world_.rank(), world_.size(), mb, accum, setup_.micro_batch};
      FillChainBatch(setup_.data_seed, slice.FirstSampleIndex(), setup_.micro_batch, &x_, &y_);
      STRATA_RETURN_IF_ERROR(e_.BeginMicroBatch());
      const double normaliser = static_cast<double>(slice.GlobalBatchSize()) / scale;
      STRATA_ASSIGN_OR_RETURN(double l, driver_.ForwardBackward(setup_.program(step, mb), x_, y_,
                                                                setup_.micro_batch, normaliser, hooks));
      sum += l / scale;
    }
    STRATA_ASSIGN_OR_RETURN(StepResult r, e_.Step());
    STRATA_ASSIGN_OR_RETURN(*loss, zero::SumInRankOrder(world_, sum));
    return r;
  }

 private:
  Communicator& world_;
  Engine& e_;
  const ChainSetup& setup_;
  ChainDriver driver_;
  ExternalGradHooks external_;
  std::vector<float> x_, y_;
};

// Trains `setup` with the engine on this rank's slices of the data (every rank calls it).
inline ChainRun RunChainEngine(Communicator& world, const Config& config, const ChainSetup& setup) {
  ChainRun run;
  auto dev = EngineDevice(config);
  if (!dev.ok()) return FailedRun(dev.status());
  auto engine = Engine::Create(config, setup.model, ChainInit(setup.model, setup.init_seed),
                               EngineResources{&world, dev->get()});
  if (!engine.ok()) return FailedRun(engine.status());
  Engine& e = **engine;
  if (e.model_backend() != Backend::kCpu) {
    return FailedRun(InternalError("the sim device must run the CPU kernels"));
  }
  ChainStepper stepper(world, e, setup);
  auto train = [&]() -> Status {
    for (int step = 0; step < setup.steps; ++step) {
      if (setup.lr_at) STRATA_RETURN_IF_ERROR(e.SetLearningRate(setup.lr_at(step)));
      double loss = 0;
      STRATA_ASSIGN_OR_RETURN(StepResult r, stepper.Step(config, step, &loss));
      run.losses.push_back(loss);
      run.grad_norms.push_back(r.grad_norm);
      run.clip_coefs.push_back(r.clip_coef);
    }
    return OkStatus();
  };
  return FinishRun(std::move(run), train(), e, **dev, setup.model.tensors.size());
}

// One step of the references: DeepSpeed's clipping rule (clip = max_norm / (norm + 1e-6)
// when that is below 1) and AdamStepReference per tensor over the window's summed
// gradients `acc`; the step's norm and clip go into `run`.
inline Status ReferenceUpdate(const Config& config, int step, const std::vector<std::vector<float>>& acc,
                              AdamParams& adam, std::vector<std::vector<float>>& m,
                              std::vector<std::vector<float>>& v, DenseHooks& dense, ChainRun& run) {
  double sum_sq = 0;
  for (const auto& g : acc) {
    for (float e : g) sum_sq += double(e) * e;
  }
  const double norm = std::sqrt(sum_sq);
  double clip = 1;
  if (config.gradient_clipping > 0 && config.gradient_clipping / (norm + 1e-6) < 1) {
    clip = config.gradient_clipping / (norm + 1e-6);
  }
  adam.step = step + 1;
  adam.grad_scale = static_cast<float>(clip);
  for (size_t t = 0; t < acc.size(); ++t) {
    STRATA_RETURN_IF_ERROR(AdamStepReference(adam, dense.master(t).data(), m[t].data(), v[t].data(),
                                             GradView{acc[t].data(), DType::kF32}, m[t].size()));
  }
  run.grad_norms.push_back(norm);
  run.clip_coefs.push_back(clip);
  return OkStatus();
}

// The same training on one rank with every parameter dense: micro-batch mb of all
// `world_size` ranks at once, gradients summed over micro-batches (a tensor without a
// backward use adds zero), DeepSpeed's clipping rule, AdamStepReference per tensor (as
// zero::TrainReference does). No fp16: these tests have no loss scaling.
inline ChainRun TrainChainReference(const Config& config, const ChainSetup& setup, int world_size) {
  ChainRun run;
  if (config.fp16.enabled) {
    return FailedRun(UnimplementedError("the chain reference has no fp16 loss scaling"));
  }
  const DType compute = config.bf16 ? DType::kBf16 : DType::kF32;
  DenseHooks dense(setup.model, compute, ChainInit(setup.model, setup.init_seed));
  ChainDriver driver(setup.model);
  const size_t num = setup.model.tensors.size();
  std::vector<std::vector<float>> m(num), v(num), acc(num);
  for (size_t t = 0; t < num; ++t) {
    m[t].assign(dense.master(t).size(), 0.0f);
    v[t] = m[t];
  }
  AdamParams adam = zero::AdamFromConfig(config);
  const int accum = config.gradient_accumulation_steps;
  const int64_t batch = setup.micro_batch * world_size;
  std::vector<float> x, y;
  for (int step = 0; step < setup.steps; ++step) {
    double loss = 0;
    for (size_t t = 0; t < num; ++t) acc[t].assign(m[t].size(), 0.0f);
    for (int mb = 0; mb < accum; ++mb) {
      const model::BatchSlice slice{step, 0, 1, mb, accum, batch};
      FillChainBatch(setup.data_seed, slice.FirstSampleIndex(), batch, &x, &y);
      dense.BeginMicroBatch();
      auto l = driver.ForwardBackward(setup.program(step, mb), x, y, batch,
                                      static_cast<double>(slice.GlobalBatchSize()), dense);
      if (!l.ok()) return FailedRun(l.status());
      loss += *l;
      for (size_t t = 0; t < num; ++t) {
        if (!dense.used(t)) continue;
        for (size_t i = 0; i < acc[t].size(); ++i) acc[t][i] += dense.grad(t)[i];
      }
    }
    if (setup.lr_at) adam.lr = static_cast<float>(setup.lr_at(step));
    run.status = ReferenceUpdate(config, step, acc, adam, m, v, dense, run);
    if (!run.status.ok()) return run;
    dense.SyncCompute();
    run.losses.push_back(loss);
  }
  for (size_t t = 0; t < num; ++t) run.params.push_back(dense.master(t));
  return run;
}

// Largest |a - b| / (atol + rtol |b|) over every parameter; <= 1 means within tolerance.
inline double ChainParamError(const ChainRun& run, const ChainRun& ref, double atol, double rtol) {
  if (run.params.size() != ref.params.size()) return INFINITY;
  double worst = 0;
  for (size_t t = 0; t < ref.params.size(); ++t) {
    const auto& a = run.params[t];
    const auto& b = ref.params[t];
    if (a.size() != b.size()) return INFINITY;
    for (size_t i = 0; i < a.size(); ++i) {
      const double err = std::fabs(double(a[i]) - b[i]) / (atol + rtol * std::fabs(double(b[i])));
      if (!(err <= worst)) worst = std::isnan(err) ? INFINITY : err;
    }
  }
  return worst;
}

inline void ExpectChainMatches(const ChainRun& run, const ChainRun& ref, bool bf16, const std::string& what) {
  ASSERT_TRUE(run.status.ok()) << what << ": " << run.status.ToString();
  ASSERT_EQ(run.losses.size(), ref.losses.size()) << what;
  const double loss_rtol = bf16 ? kChain16LossRtol : kChainLossRtol;
  const double norm_rtol = bf16 ? kChain16NormRtol : kChainNormRtol;
  for (size_t i = 0; i < ref.losses.size(); ++i) {
    EXPECT_NEAR(run.losses[i], ref.losses[i], loss_rtol * std::fabs(ref.losses[i]))
        << what << ": loss of step " << i;
    // The norm sees every gradient once: a tensor counted twice, or a use dropped, shows.
    EXPECT_NEAR(run.grad_norms[i], ref.grad_norms[i], norm_rtol * ref.grad_norms[i])
        << what << ": norm of step " << i;
    EXPECT_NEAR(run.clip_coefs[i], ref.clip_coefs[i], norm_rtol * ref.clip_coefs[i])
        << what << ": clip of step " << i;
  }
  const double err =
      bf16 ? ChainParamError(run, ref, kChain16Atol, 0) : ChainParamError(run, ref, kChainAtol, kChainRtol);
  EXPECT_LE(err, 1.0) << what << ": final parameters differ from the reference (error " << err
                      << " x tolerance)";
  EXPECT_LE(run.device_high_water, run.device_capacity) << what;
}

// One configuration of a model: its extra JSON (over MakeConfig's) and its setup.
struct ChainVariant {
  std::string name;
  std::string extra_json;
  ChainSetup setup;
};

// Called with every run, engine or reference, for checks of a model's own.
using ChainRunCheck = std::function<void(const ChainRun& run, const std::string& what)>;

// Trains every variant with every combo and compares each with the variant's reference.
// Returns the references (for checks of their own) and prints the time taken.
inline std::vector<ChainRun> CheckChainVariants(Communicator& world,
                                                const std::vector<ChainVariant>& variants,
                                                const std::vector<Combo>& combos,
                                                const ChainRunCheck& also = {}) {
  std::vector<ChainRun> refs;
  const auto t0 = std::chrono::steady_clock::now();
  for (const ChainVariant& var : variants) {
    const Config ref_config = MakeConfig({0, "none", "none"}, var.extra_json);
    refs.push_back(TrainChainReference(ref_config, var.setup, world.size()));
    const ChainRun& ref = refs.back();
    EXPECT_TRUE(ref.status.ok()) << var.name << ": " << ref.status.ToString();
    if (!ref.status.ok()) continue;
    for (double l : ref.losses) EXPECT_TRUE(std::isfinite(l)) << var.name << ": the reference lost its way";
    if (also) also(ref, var.name + " reference");
    // A tensor listed by several modules is one parameter.
    int64_t declared = 0;
    for (const TensorDecl& t : var.setup.model.tensors) declared += t.numel();
    for (const Combo& c : combos) {
      const std::string what = var.name + " " + ComboName(c) + " world " + std::to_string(world.size());
      ChainRun run = RunChainEngine(world, MakeConfig(c, var.extra_json), var.setup);
      ExpectChainMatches(run, ref, ref_config.bf16, what);
      if (!run.status.ok()) continue;
      EXPECT_EQ(run.layout.num_params, declared) << what;
      if (also) also(run, what);
    }
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (world.rank() == 0) {
    std::printf("%zu variants x %zu combos: %.1f s\n", variants.size(), combos.size(), s);
  }
  return refs;
}

// --- the models ----------------------------------------------------------------------

// n modules Linear(32 -> 32), tensors of their own.
inline ModelDecl PlainChain(int n) {
  ModelDecl model;
  for (int m = 0; m < n; ++m) AddLinear(&model, kChainWidth, kChainWidth);
  return model;
}

inline ChainProgramFn Always(ChainProgram program) {
  return [program](int, int) { return program; };
}

// The first and the last module read the same weight (an input embedding tied to the
// output head), with biases of their own or the same one: one parameter each, whose
// gradient is the sum of both uses. Also with accumulation and clipping engaged.
inline void CheckTiedWeight(Communicator& world, const std::vector<Combo>& combos) {
  ModelDecl tied = PlainChain(4), both = PlainChain(4);
  AddSharedLinear(&tied, /*weight=*/0, /*bias=*/-1);
  AddSharedLinear(&both, /*weight=*/0, /*bias=*/1);
  const std::vector<ChainVariant> variants = {
      {"tied weight", "", {tied, Always(Sequential(5))}},
      {"tied weight, accumulation 2, clipping",
       R"({"gradient_accumulation_steps": 2, "gradient_clipping": 0.01})",
       {tied, Always(Sequential(5))}},
      {"tied weight and bias", "", {both, Always(Sequential(5))}}};
  auto refs = CheckChainVariants(world, variants, combos);
  int clipped = 0;
  for (double c : refs[1].clip_coefs) clipped += c < 1;
  EXPECT_EQ(clipped, static_cast<int>(refs[1].clip_coefs.size())) << "clipping should engage in every step";
}

// Activation checkpointing: calls 1-2 and 4-5 (the output) are checkpointed blocks,
// recomputed in the backward pass before their backward; also in bf16, where the
// recompute must see the same 16-bit parameters as the forward.
inline void CheckExternalGradients(Communicator& world, const std::vector<Combo>& combos) {
  ModelDecl tied = PlainChain(4);
  AddSharedLinear(&tied, /*weight=*/0, /*bias=*/-1);
  ChainSetup plain{tied, Always(Sequential(5))};
  plain.external_grads = true;
  ChainProgram program = Sequential(5);
  program[1].recompute = program[2].recompute = true;
  ChainSetup recompute{tied, Always(program)};
  recompute.external_grads = true;
  CheckChainVariants(world,
                     {{"gradients handed in, tied weight", "", plain},
                      {"gradients handed in, recompute, accumulation 2",
                       R"({"gradient_accumulation_steps": 2})", recompute}},
                     combos);
}

inline void CheckRecompute(Communicator& world, const std::vector<Combo>& combos) {
  ChainProgram program = Sequential(6);
  for (int c : {1, 2, 4, 5}) program[c].recompute = true;
  const ChainSetup setup{PlainChain(6), Always(program)};
  CheckChainVariants(
      world, {{"recompute", "", setup}, {"recompute bf16", R"({"bf16": {"enabled": true}})", setup}}, combos);
}

// Modules 0 and 2 have no backward (frozen; module 2 is Fetched again for the gradient
// that flows through it). Their tensors get gradient zero and AdamW still steps them, as
// DeepSpeed does for parameters without gradients in its flat groups: with zero moments
// that is the decay alone, p * (1 - lr wd) per step.
inline void CheckFrozen(Communicator& world, const std::vector<Combo>& combos) {
  ChainProgram program = Sequential(5);
  program[0].frozen = program[2].frozen = true;
  const ChainSetup setup{PlainChain(5), Always(program)};
  const Config config = MakeConfig({0, "none", "none"});
  const double decay = std::pow(1.0 - config.optimizer.lr * config.optimizer.weight_decay, setup.steps);
  const TensorInit init = ChainInit(setup.model, setup.init_seed);
  auto decayed_only = [&](const ChainRun& run, const std::string& what) {
    for (int m : {0, 2}) {
      for (TensorId t : setup.model.modules[m].tensors) {
        std::vector<float> p0(run.params[t].size());
        init(t, 0, static_cast<int64_t>(p0.size()), p0.data());
        double worst = 0;
        for (size_t i = 0; i < p0.size(); ++i) {
          worst = std::max(worst,
                           std::fabs(run.params[t][i] - p0[i] * decay) / (1e-6 * std::fabs(p0[i]) + 1e-12));
        }
        EXPECT_LE(worst, 1.0) << what << ": frozen tensor " << t << " is not its initial value decayed "
                              << setup.steps << " times";
      }
    }
  };
  CheckChainVariants(world, {{"frozen modules 0 and 2", "", setup}}, combos, decayed_only);
}

// Module 1 is called twice apart and module 2 twice in a row in one forward: each
// tensor's gradient is the sum of its module's two backward uses.
inline void CheckCalledTwice(Communicator& world, const std::vector<Combo>& combos) {
  const ChainProgram program = {{0}, {1}, {2}, {2}, {1}, {3}};
  CheckChainVariants(world, {{"module called twice", "", {PlainChain(4), Always(program)}}}, combos);
}

// Two tensors three times the chunk the engine would otherwise use (strata.chunk_size
// 8 KiB, rounded to world x 2048 elements), [32 -> E] and [E -> 32], before ten small
// modules that share chunks.
constexpr char kRunChunks[] = R"({"strata": {"chunk_size": "8KiB"}})";
inline ModelDecl ChainWithRuns(int world_size) {
  const int64_t wide = 3 * 2048 * world_size / kChainWidth;
  ModelDecl model;
  AddLinear(&model, kChainWidth, wide);
  AddLinear(&model, wide, kChainWidth);
  for (int m = 0; m < 10; ++m) AddLinear(&model, kChainWidth, kChainWidth);
  return model;
}

inline void CheckTensorLargerThanAChunk(Communicator& world, const std::vector<Combo>& combos) {
  const int64_t chunk = 2048 * world.size();
  const ModelDecl model = ChainWithRuns(world.size());
  ASSERT_EQ(model.tensors[0].numel(), 3 * chunk);
  // The two are outliers beside the ten small modules: each takes a run of 3 chunks.
  auto layout = zero::MakeLayout(model, 8 << 10, world.size());
  ASSERT_TRUE(layout.ok()) << layout.status().ToString();
  ASSERT_EQ(layout->chunk_elems, chunk);
  ASSERT_EQ(layout->run_length[0], 3);
  CheckChainVariants(world, {{"tensor of 3 chunks", kRunChunks, {model, Always(Sequential(12))}}}, combos);
}

// The call order changes between steps: plain; module 1 twice with a recomputed pair;
// plain again. Only the backward changes: a recomputed pair added for steps 2-3, so the
// forward matches the recording and the departure shows in the backward only. With
// accumulation 2, the order changes between the micro-batches of a step (the first
// micro-batch's order is the one the engine records).
inline void CheckOrderChanges(Communicator& world, const std::vector<Combo>& combos) {
  const ChainProgram plain = Sequential(4);
  const ChainProgram twice = {{0}, {1}, {2, false, true}, {1, false, true}, {3}};
  ChainProgram recomputed = plain;
  recomputed[1].recompute = recomputed[2].recompute = true;
  auto steps_2_3 = [plain](const ChainProgram& changed) -> ChainProgramFn {
    return [plain, changed](int step, int) { return step == 2 || step == 3 ? changed : plain; };
  };
  ChainSetup by_step{PlainChain(4), steps_2_3(twice)}, backward_only{PlainChain(4), steps_2_3(recomputed)};
  by_step.steps = backward_only.steps = 5;
  ChainSetup by_micro{PlainChain(4), [plain, twice](int step, int micro) {
                        return (micro == 0) == (step < 2) ? plain : twice;
                      }};
  CheckChainVariants(
      world,
      {{"order changes between steps", "", by_step},
       {"recompute added between steps", "", backward_only},
       {"order changes between micro-batches", R"({"gradient_accumulation_steps": 2})", by_micro}},
      combos);
}

}  // namespace strata::testing
