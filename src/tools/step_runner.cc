#include "tools/step_runner.h"

#include "tools/model_engine.h"
#include "tools/plan_model.h"
#include "zero/gpt_trainer.h"

namespace strata::tools {

StepRunner MlpStepRunner(const model::MlpSpec& spec) {
  return [spec](Communicator& world, const Config& config, const StepRunOptions& o) -> Result<StepLog> {
    STRATA_ASSIGN_OR_RETURN(ModelEngine e, CreateMlpEngine(world, config, spec, o.micro_batch, o.timeline));
    zero::TrainSpec t;
    t.model = spec;
    t.data.seed = o.data_seed;
    t.steps = o.steps;
    t.micro_batch = o.micro_batch;
    t.step_boundary = o.step_boundary;
    STRATA_ASSIGN_OR_RETURN(zero::TrainLog log, zero::TrainWithEngine(*e.engine, world, config, t));
    return StepLog{std::move(log.timing), std::move(log.results), std::move(log.losses),
                   e.engine->layout_info()};
  };
}

StepRunner GptStepRunner(const model::GptSpec& spec, int64_t seq,
                         std::shared_ptr<const model::TokenFile> train, bool recompute) {
  return [spec, seq, train, recompute](Communicator& world, const Config& config,
                                       const StepRunOptions& o) -> Result<StepLog> {
    ParamInit init = [spec](TensorId t, int64_t b, int64_t n, float* out) {
      model::InitGptTensor(spec, t, b, n, out);
    };
    const double activations = GptActivationBytes(spec, seq, recompute) * static_cast<double>(o.micro_batch);
    STRATA_ASSIGN_OR_RETURN(ModelEngine e, CreateModelEngine(world, config, model::GptModel(spec), init,
                                                             o.timeline, static_cast<uint64_t>(activations)));
    zero::GptTrainSpec ts;
    ts.model = spec;
    ts.seq = seq;
    ts.micro_batch = o.micro_batch;
    ts.data_seed = o.data_seed;
    ts.recompute = recompute;
    zero::GptTrainer trainer(*e.engine, world, config, ts, *train, nullptr);
    STRATA_RETURN_IF_ERROR(trainer.Check());
    StepLog log;
    for (int i = 0; i < o.steps; ++i) {
      if (o.step_boundary) o.step_boundary(i, false);
      STRATA_ASSIGN_OR_RETURN(zero::GptStepReport r, trainer.RunStep(i, /*flush=*/i + 1 == o.steps));
      if (o.step_boundary) o.step_boundary(i, true);
      log.timing.push_back(r.timing);
      log.results.push_back(r.result);
      log.losses.push_back(r.loss);
    }
    log.layout = e.engine->layout_info();
    return log;
  };
}

}  // namespace strata::tools
