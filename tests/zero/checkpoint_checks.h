// The bodies of the checkpoint tests, run at world size 1 (engine_checkpoint_test) and
// under mpirun -np 2 and -np 4 (engine_checkpoint_mpi_test): train, save, train on
// (run A); a new engine with other initial values loads the checkpoint and trains the
// same steps (run B); A and B must agree bit for bit, losses and every master.
#pragma once

#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "engine_harness.h"
#include "engine_model_checks.h"
#include "strata/checkpoint.h"
#include "strata/mlp.h"
#include "strata/model.h"

namespace strata::testing {

// A directory for one test's checkpoints, the same on every rank (under SwapDir, which
// goes at exit), emptied first.
inline std::string CheckpointRoot(const std::string& name) {
  const std::string root = SwapDir() + "/ckpt-" + name;
  return root;
}

struct EngineBox {
  std::unique_ptr<Device> device;
  std::unique_ptr<Engine> engine;  // declared last: goes first
};

// An engine for the reference MLP of `spec`, initialised from spec.model.seed.
inline Result<EngineBox> MakeEngine(Communicator& world, const Config& config, const zero::TrainSpec& spec,
                                    std::shared_ptr<IoFaultHook> faults = nullptr) {
  EngineBox box;
  STRATA_ASSIGN_OR_RETURN(box.device, EngineDevice(config));
  EngineResources res{&world, box.device.get()};
  res.io_fault_hook = std::move(faults);
  STRATA_ASSIGN_OR_RETURN(box.engine,
                          Engine::Create(config, model::MlpModules(spec.model), MlpInit(spec), res));
  return box;
}

// Steps [first, first + count) of the training TrainWithEngine runs (the same batches).
inline Status TrainSteps(Engine& e, Communicator& world, const Config& config, const zero::TrainSpec& spec,
                         int first, int count, std::vector<double>* losses) {
  model::Mlp mlp(spec.model, e.model_backend(), e.model_stream());
  model::SyntheticData data(spec.model, spec.data);
  model::Batch batch;
  const int accum = config.gradient_accumulation_steps;
  for (int step = first; step < first + count; ++step) {
    double loss = 0;
    const double scale = e.loss_scale();
    for (int m = 0; m < accum; ++m) {
      const model::BatchSlice slice{step, world.rank(), world.size(), m, accum, spec.micro_batch};
      STRATA_RETURN_IF_ERROR(data.Fill(slice, &batch));
      STRATA_RETURN_IF_ERROR(e.BeginMicroBatch());
      STRATA_ASSIGN_OR_RETURN(
          double l, mlp.ForwardBackward(batch, static_cast<double>(slice.GlobalBatchSize()) / scale, e));
      loss += l / scale;
    }
    STRATA_ASSIGN_OR_RETURN(StepResult r, e.Step());
    (void)r;
    STRATA_ASSIGN_OR_RETURN(loss, zero::SumInRankOrder(world, loss));
    losses->push_back(loss);
  }
  return OkStatus();
}

// Every tensor's fp32 master (collective).
inline Result<std::vector<std::vector<float>>> Masters(Engine& e, size_t tensors) {
  std::vector<std::vector<float>> out;
  for (size_t t = 0; t < tensors; ++t) {
    out.emplace_back();
    STRATA_RETURN_IF_ERROR(e.GatherMaster(static_cast<TensorId>(t), &out.back()));
  }
  return out;
}

// What is trained: how its engine is made (other_init: initial values unlike the saving
// run's, so that nothing of the loading engine's own may survive the load) and how steps
// [first, first + count) run.
struct ResumeSubject {
  std::function<Result<EngineBox>(const Config& config, bool other_init)> make;
  std::function<Status(Engine& e, const Config& config, int first, int count, std::vector<double>* losses)>
      train;
  size_t tensors = 0;
};

// kind: the engine's device (cuda: engine_checkpoint_gpu_test, one rank).
inline ResumeSubject MlpSubject(Communicator& world, const zero::TrainSpec& spec,
                                DeviceKind kind = DeviceKind::kSim) {
  ResumeSubject s;
  s.make = [&world, spec, kind](const Config& config, bool other_init) -> Result<EngineBox> {
    zero::TrainSpec init = spec;
    if (other_init) init.model.seed += 1000;
    EngineBox box;
    STRATA_ASSIGN_OR_RETURN(box.device, EngineDevice(config, kind));
    // The initialiser reads `init` during Create only.
    STRATA_ASSIGN_OR_RETURN(box.engine, Engine::Create(config, model::MlpModules(spec.model), MlpInit(init),
                                                       EngineResources{&world, box.device.get()}));
    return box;
  };
  s.train = [&world, spec](Engine& e, const Config& config, int first, int count,
                           std::vector<double>* losses) {
    return TrainSteps(e, world, config, spec, first, count, losses);
  };
  s.tensors = model::MlpModules(spec.model).tensors.size();
  return s;
}

// A chain model (chain_model.h) trained as RunChainEngine trains it.
inline ResumeSubject ChainSubject(Communicator& world, const ChainSetup& setup) {
  ResumeSubject s;
  s.make = [&world, setup](const Config& config, bool other_init) -> Result<EngineBox> {
    EngineBox box;
    STRATA_ASSIGN_OR_RETURN(box.device, EngineDevice(config));
    STRATA_ASSIGN_OR_RETURN(
        box.engine, Engine::Create(config, setup.model, ChainInit(setup.model, setup.init_seed + other_init),
                                   EngineResources{&world, box.device.get()}));
    return box;
  };
  s.train = [&world, setup](Engine& e, const Config& config, int first, int count,
                            std::vector<double>* losses) {
    ChainStepper stepper(world, e, setup);
    for (int step = first; step < first + count; ++step) {
      double loss = 0;
      STRATA_RETURN_IF_ERROR(stepper.Step(config, step, &loss).status());
      losses->push_back(loss);
    }
    return OkStatus();
  };
  s.tensors = setup.model.tensors.size();
  return s;
}

struct ResumeRun {
  std::vector<double> losses;
  std::vector<std::vector<float>> masters;
};

// Run A: `saved_at` steps, save into `dir`, `more` steps. finish_after > 0: the save is
// started (StartCheckpoint) and finished after that many of the `more` steps.
inline Result<ResumeRun> TrainSaveAndGoOn(const ResumeSubject& subject, const Config& config,
                                          const std::string& dir, int saved_at, int more,
                                          int finish_after = 0, CheckpointTimes* times = nullptr) {
  STRATA_ASSIGN_OR_RETURN(EngineBox a, subject.make(config, /*other_init=*/false));
  ResumeRun run;
  std::vector<double> before;
  STRATA_RETURN_IF_ERROR(subject.train(*a.engine, config, 0, saved_at, &before));
  CheckpointMeta meta;
  meta.json = R"({"next_step": )" + std::to_string(saved_at) + R"(, "data_seed": 11})";
  if (finish_after > 0) {
    STRATA_RETURN_IF_ERROR(a.engine->StartCheckpoint(dir, meta));
    STRATA_RETURN_IF_ERROR(subject.train(*a.engine, config, saved_at, finish_after, &run.losses));
    STRATA_ASSIGN_OR_RETURN(CheckpointTimes t, a.engine->FinishCheckpoint());
    if (times != nullptr) *times = t;
    saved_at += finish_after;
    more -= finish_after;
  } else {
    STRATA_RETURN_IF_ERROR(a.engine->SaveCheckpoint(dir, meta));
  }
  STRATA_RETURN_IF_ERROR(subject.train(*a.engine, config, saved_at, more, &run.losses));
  STRATA_RETURN_IF_ERROR(a.engine->Flush());
  STRATA_ASSIGN_OR_RETURN(run.masters, Masters(*a.engine, subject.tensors));
  return run;
}

// Run B: a new engine loads `dir` and trains `more` steps from `saved_at`.
inline Result<ResumeRun> LoadAndGoOn(const ResumeSubject& subject, const Config& config,
                                     const std::string& dir, int saved_at, int more) {
  STRATA_ASSIGN_OR_RETURN(EngineBox b, subject.make(config, /*other_init=*/true));
  CheckpointMeta meta;
  STRATA_RETURN_IF_ERROR(b.engine->LoadCheckpoint(dir, &meta));
  if (meta.step_calls != saved_at ||
      meta.json.find("\"next_step\":" + std::to_string(saved_at)) == std::string::npos) {
    return InternalError("meta after load: step_calls " + std::to_string(meta.step_calls) + ", json " +
                         meta.json);
  }
  ResumeRun run;
  STRATA_RETURN_IF_ERROR(subject.train(*b.engine, config, saved_at, more, &run.losses));
  STRATA_RETURN_IF_ERROR(b.engine->Flush());
  STRATA_ASSIGN_OR_RETURN(run.masters, Masters(*b.engine, subject.tensors));
  return run;
}

inline void ExpectSameRun(const ResumeRun& a, const ResumeRun& b) {
  EXPECT_EQ(a.losses, b.losses);
  ASSERT_EQ(a.masters.size(), b.masters.size());
  for (size_t t = 0; t < a.masters.size(); ++t) EXPECT_EQ(a.masters[t], b.masters[t]) << "tensor " << t;
}

// Saved with `save` + save_extra, loaded with `load` + load_extra: the runs agree bit for
// bit. The extras may differ only where that changes no result (strata.chunk_size, with
// no clipping: a resharded load).
inline void CheckLoadBitExact(const ResumeSubject& subject, const Combo& save, const std::string& save_extra,
                              const Combo& load, const std::string& load_extra, int saved_at = 3,
                              int more = 3) {
  const std::string name = ComboName(save) + " " + save_extra + " -> " + ComboName(load) + " " + load_extra;
  SCOPED_TRACE(name);
  const std::string dir = CheckpointRoot("resume") + "/" + std::to_string(std::hash<std::string>()(name));
  auto a = TrainSaveAndGoOn(subject, MakeConfig(save, save_extra), dir, saved_at, more);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  auto b = LoadAndGoOn(subject, MakeConfig(load, load_extra), dir, saved_at, more);
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  ExpectSameRun(*a, *b);
}

// Saved with `save` (+ extra), loaded with `load` (+ extra): the runs agree bit for bit.
inline void CheckResumeBitExact(const ResumeSubject& subject, const Combo& save, const Combo& load,
                                const std::string& extra = "", int saved_at = 3, int more = 3) {
  CheckLoadBitExact(subject, save, extra, load, extra, saved_at, more);
}

inline void CheckResumeBitExact(Communicator& world, const Combo& save, const Combo& load,
                                const std::string& extra = "") {
  CheckResumeBitExact(MlpSubject(world, SmallSpec()), save, load, extra);
}

// One of each tier a state can be saved from or loaded into.
inline std::vector<Combo> ResumeCombos() {
  return {{0, "none", "none"}, {1, "cpu", "none"},  {2, "none", "none"},
          {3, "cpu", "cpu"},   {3, "nvme", "nvme"}, {3, "nvme", "nvme", "auto", kPiecedSubGroup}};
}

inline void CheckEveryComboResumes(Communicator& world, const std::vector<Combo>& combos,
                                   const std::string& extra = "") {
  for (const Combo& c : combos) CheckResumeBitExact(world, c, c, extra);
}

// A tied weight, a recomputed block and gradients handed in: the recorded call order
// (forward uses inside the backward, gradients of tensors) goes with the checkpoint.
inline void CheckChainResumes(Communicator& world, const std::vector<Combo>& combos) {
  ModelDecl tied = PlainChain(4);
  AddSharedLinear(&tied, /*weight=*/0, /*bias=*/-1);
  ChainProgram program = Sequential(5);
  program[1].recompute = program[2].recompute = true;
  ChainSetup recompute{tied, Always(program)};
  ChainSetup external{tied, Always(Sequential(5))};
  external.external_grads = true;
  for (const ChainSetup& setup : {recompute, external}) {
    for (const Combo& c : combos) CheckResumeBitExact(ChainSubject(world, setup), c, c);
  }
}

}  // namespace strata::testing
