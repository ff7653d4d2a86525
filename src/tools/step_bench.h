// `strata bench step`: training steps of a model (the reference MLP or the GPT) under a
// configuration, with where the time went, the bytes per link, the high-water marks
// and the step-time model beside the measurement.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "strata/comm.h"
#include "strata/config.h"
#include "strata/disk_stats.h"
#include "tools/plan_model.h"
#include "tools/process_memory.h"
#include "tools/step_model.h"
#include "zero/trainer.h"

namespace strata::tools {

using zero::StepTiming;

struct StepBenchOptions {
  Config config;
  // The model: its run_steps (required), description and activations per sample (for
  // the process estimate).
  PlanModel model;
  // The model's shape in the report's "model" object ({"hidden": [...]} for the MLP).
  nlohmann::json model_keys = nlohmann::json::object();
  int steps = 3;  // measured steps, after one warm-up step
  int64_t micro_batch = 1;
  uint64_t data_seed = 1;
  bool compare_serial = true;  // run again with strata.overlap false, same process
  bool measure_rates = true;   // lane rates for the step-time model
};

struct StepBenchRun {
  int steps = 0;      // measured steps (after the warm-up step)
  double step_s = 0;  // mean over the measured steps
  StepTiming timing;  // means
  StepResult last;
  EngineLayoutInfo layout;
  std::vector<double> losses;
  // The swap disk's counters from the start of the first measured step to the end of
  // the last (every process's I/O to it): disk_name empty and disk_unavailable saying
  // why when the run has no swap directory or it has no block device.
  std::string disk_name, disk_unavailable;
  DiskActivity disk;
  // The process's peak resident set after the run (getrusage; every allocation so far,
  // the engine's pinned arena and, on the sim device, its "device" memory included).
  uint64_t peak_rss = 0;
  // The plan's estimate of the process's own memory beside the tiers (from its resident
  // set before the engine was created).
  ProcessMemory process;
};

// Runs the configured engine (and the serial variant), collective over `world`.
// Returns the report as JSON; `text` receives the human-readable form.
Result<nlohmann::json> RunStepBench(Communicator& world, const StepBenchOptions& options, std::string* text);

// The report's line for the swap disk `name` over `steps` measured steps; with the
// probe's mixed rate (bytes/s; 0: none) the disk's rate is also given as a fraction of it.
std::string FormatDiskLine(const std::string& name, const DiskActivity& d, int steps, double mixed_rate);

// `strata bench step --repeat N`: the shared disk's rate drifts by ±10% between runs,
// so one run's efficiency is noise-prone. The medians over rounds (each a whole
// RunStepBench: overlapped run, probe, overlap-off run, probe) of step_s,
// overlap_efficiency, overlap_efficiency_mixed, speedup, speedup_fraction_of_predicted
// and (where measured) the disk's busy fraction; a round whose step beat its bound
// (probe_slower_than_step) counts for the step time and speedup but not for the figures
// measured against the bound, and one whose step beat only the mixed bound
// (mixed_bound_beaten) not for the mixed efficiency. Returns {"rounds": [...],
// "median": {...}, "invalid_bound_rounds": n}; `text` receives a one-line-per-round table.
nlohmann::json SummarizeRounds(const std::vector<nlohmann::json>& rounds, std::string* text);

}  // namespace strata::tools
