// `strata bench step` and `strata train`: training steps of the reference MLP under a
// configuration, with where the time went, the bytes per link, the high-water marks
// and the step-time model beside the measurement.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "strata/comm.h"
#include "strata/config.h"
#include "zero/step_model.h"
#include "zero/trainer.h"

namespace strata::zero {

struct StepBenchOptions {
  Config config;
  TrainSpec spec;             // spec.steps measured steps follow one warm-up step
  bool compare_serial = true; // run again with strata.overlap false, same process
  bool measure_rates = true;  // lane rates for the step-time model
  bool print_losses = false;  // one line per step (strata train)
};

struct StepBenchRun {
  double step_s = 0;  // mean over the measured steps
  StepTiming timing;  // means
  StepResult last;
  EngineLayoutInfo layout;
  std::vector<double> losses;
};

// Runs the configured engine (and the serial variant), collective over `world`.
// Returns the report as JSON; `text` receives the human-readable form.
Result<nlohmann::json> RunStepBench(Communicator& world, const StepBenchOptions& options, std::string* text);

}  // namespace strata::zero
