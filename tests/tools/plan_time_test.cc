// The step time `strata plan` predicts (plan_time.h), worked by hand: the serial and
// overlapped step on shared cores and on a GPU, accumulation's two stretches, a shallow
// NVMe pipeline, and which engine calibration each optimizer placement steps at (with
// the saved profile's fallbacks).
#include "tools/plan_time.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "tools/step_model.h"

namespace strata::tools {
namespace {

TEST(PlanTime, HandWorkedOnSharedCoresAndOnAGpu) {
  LaneRates r;
  r.copy_bytes_per_s = 10e9;
  r.nvme_read_bytes_per_s = 2e9;
  r.nvme_write_bytes_per_s = 4e9;
  r.host_optimizer = {1e9, 1e-9, 1.2};
  r.device_optimizer = {2e9, 0, 1.0};
  LaneWork w;
  w.compute_s = 0.2;
  w.adam_params = 1e8;       // host: 0.1 s stepping + 0.1 s the rest
  w.copy_bytes = 1e9;        // 0.1 s
  w.nvme_read_bytes = 1e9;   // 0.5 s
  w.nvme_write_bytes = 1e9;  // 0.25 s
  PlanTime t = PredictPlanTime(r, w, /*shared_cpu=*/true, OffloadDevice::kCpu, 1);
  EXPECT_DOUBLE_EQ(t.cpu_s, 0.5);
  EXPECT_DOUBLE_EQ(t.disk_s, 0.75);
  EXPECT_DOUBLE_EQ(t.serial_s, 1.25);
  EXPECT_DOUBLE_EQ(t.overlapped_s, 0.75);
  EXPECT_EQ(t.critical, "nvme");
  r.nvme_mixed_bytes_per_s = 4e9;  // both at once: 0.5 s; the cores then bind at 0.5 x 1.2
  t = PredictPlanTime(r, w, true, OffloadDevice::kCpu, 1);
  EXPECT_DOUBLE_EQ(t.overlapped_s, 0.6);
  EXPECT_EQ(t.critical, "cpu");
  t = PredictPlanTime(r, w, /*shared_cpu=*/false, OffloadDevice::kNone, 1);  // optimizer 0.05 s
  EXPECT_DOUBLE_EQ(t.overlapped_s, 0.5);
  EXPECT_EQ(t.critical, "nvme");
  w.nvme_param_read_bytes = 0.2e9;  // the gathers wait for these: 0.1 s on top
  t = PredictPlanTime(r, w, true, OffloadDevice::kCpu, 1);
  EXPECT_DOUBLE_EQ(t.overlapped_s, 0.7);
  EXPECT_EQ(t.critical, "cpu + gather reads");
  EXPECT_DOUBLE_EQ(t.serial_s, 1.25) << "the serial step counts each read once";
}

// With accumulation, the gradient shards' traffic before the last micro-batch cannot
// share the disk with the state's after it: two stretches, each its slowest resource,
// the shards' reads on the backward's path in the first.
TEST(PlanTime, AccumulationTimesTheMicroBatchesBeforeTheLastApart) {
  LaneRates r;
  r.copy_bytes_per_s = 10e9;
  r.nvme_read_bytes_per_s = r.nvme_write_bytes_per_s = 2e9;
  r.host_optimizer = r.nvme_optimizer = {1e9, 0, 1.0};
  LaneWork w;
  w.compute_s = 0.4;                             // 0.3 s in the first three of four micro-batches
  w.nvme_read_bytes = w.nvme_write_bytes = 1e9;  // 1 s on the disk
  w.nvme_between_write_bytes = 0.2e9;            // of which 0.1 s before the last
  PlanTime t = PredictPlanTime(r, w, /*shared_cpu=*/true, OffloadDevice::kNvme, 3);
  EXPECT_DOUBLE_EQ(t.overlapped_s, 1.0) << "one micro-batch: one stretch";
  EXPECT_DOUBLE_EQ(t.accumulation_s, 0.0);
  w.micro_batches = 4;
  for (bool shared : {true, false}) {
    t = PredictPlanTime(r, w, shared, OffloadDevice::kNvme, 3);
    EXPECT_DOUBLE_EQ(t.accumulation_s, 0.3) << "the compute, beside 0.1 s of shards";
    EXPECT_DOUBLE_EQ(t.overlapped_s, 0.3 + 0.9) << "then 0.9 s of the disk beside 0.1 s of compute";
    EXPECT_DOUBLE_EQ(t.serial_s, 1.4);
  }
  EXPECT_EQ(t.critical, "nvme (micro-batches before the last: compute)");
  // 0.6 GB more read before the last: 0.4 s of disk there, and the reads (0.3 s) on the
  // backward's path, as the reduction reads each shard back before it adds to it.
  w.nvme_between_read_bytes = 0.6e9;
  t = PredictPlanTime(r, w, true, OffloadDevice::kNvme, 3);
  EXPECT_DOUBLE_EQ(t.accumulation_s, 0.3 + 0.3);
  EXPECT_DOUBLE_EQ(t.overlapped_s, 0.6 + 0.6);
  EXPECT_EQ(t.critical, "nvme (micro-batches before the last: cpu + gather reads)");
}

// An NVMe optimizer with fewer than three staging sets reads, steps and writes each
// piece in turn: the disk's time is then the three one after another, not the mixed
// rate's overlap of the reads and writes.
TEST(PlanTime, TwoStagingSetsSerialiseTheStatesPipeline) {
  LaneRates r;
  r.copy_bytes_per_s = 10e9;
  r.nvme_read_bytes_per_s = 2e9;
  r.nvme_write_bytes_per_s = 4e9;
  r.nvme_mixed_bytes_per_s = 4e9;
  r.nvme_optimizer = {1e9, 0, 1.0};
  LaneWork w;
  w.adam_params = 0.1e9;                         // 0.1 s of Adam
  w.nvme_read_bytes = w.nvme_write_bytes = 1e9;  // 0.5 s mixed; 0.5 + 0.25 s one after the other
  w.nvme_state = {1e9, 1e9, 0.1e9, 3};
  PlanTime t = PredictPlanTime(r, w, /*shared_cpu=*/false, OffloadDevice::kNvme, 3);
  EXPECT_DOUBLE_EQ(t.disk_s, 0.5) << "three sets: the mixed rate";
  for (int sets : {1, 2}) {
    w.nvme_state.staging_sets = sets;
    t = PredictPlanTime(r, w, false, OffloadDevice::kNvme, 3);
    EXPECT_DOUBLE_EQ(t.disk_s, 0.5 + 0.25 + 0.1) << sets << " sets: read, step and write in turn";
    EXPECT_DOUBLE_EQ(t.overlapped_s, 0.85);
  }
  // Half the disk's bytes are the gradients': only the state's pieces serialise.
  w.nvme_read_bytes = w.nvme_write_bytes = 2e9;
  t = PredictPlanTime(r, w, false, OffloadDevice::kNvme, 3);
  EXPECT_DOUBLE_EQ(t.disk_s, 1.0 + 0.35);
}

// The work of a step that only steps `params` optimizer elements.
LaneWork AdamOnly(double params) {
  LaneWork w;
  w.adam_params = params;
  return w;
}

// A CPU optimizer's device chunks (offload_optimizer.ratio) step at the split's own
// calibration, not at the device optimizer's (stage 0).
TEST(PlanTime, ADeviceSplitStepsItsChunksAtTheSplitsRates) {
  LaneRates r;
  r.host_optimizer = {1e9, 1e-9, 1.0};
  r.device_split = {5e9, 0.2e-9, 1.0};
  r.device_optimizer = {2e9, 0, 1.0};
  LaneWork w = AdamOnly(1e9);
  w.adam_params_device = 0.25e9;
  PlanTime t = PredictPlanTime(r, w, /*shared_cpu=*/false, OffloadDevice::kCpu, 1);
  // 0.75e9 at 1e9/s and 0.25e9 at 5e9/s; the rest: 0.75 s and 0.05 s.
  EXPECT_DOUBLE_EQ(t.lanes[1].second, 0.8);
  EXPECT_DOUBLE_EQ(t.lanes[2].second, 0.8);
  // The split means nothing to the other optimizer tiers.
  t = PredictPlanTime(r, w, false, OffloadDevice::kNone, 1);
  EXPECT_DOUBLE_EQ(t.lanes[1].second, 0.5);
  // A profile without the split's calibration takes the device optimizer's.
  nlohmann::json j = RatesToJson(r);
  j.erase("device_split");
  Result<LaneRates> back = RatesFromJson(j);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_DOUBLE_EQ(back->device_split.optimizer_params_per_s, 2e9);
  j["device_split"] = {{"optimizer_params_per_s", -1}, {"other_s_per_param", 0}, {"overlap_factor", 1}};
  back = RatesFromJson(j);
  ASSERT_FALSE(back.ok());
  EXPECT_NE(back.status().message().find("\"device_split.optimizer_params_per_s\""), std::string::npos)
      << back.status().ToString();
}

// A CPU optimizer at stage 3 steps at its own calibration (gathers and hooks beside the
// compute), and a profile saved before it had one reads as the stage-1 figures.
TEST(PlanTime, StageThreeTakesItsOwnHostCalibration) {
  LaneRates r;
  r.host_optimizer = {1e9, 1e-9, 1.0};
  r.host_optimizer_stage3 = {1e9, -0.5e-9, 1.0};
  LaneWork w = AdamOnly(1e9);
  EXPECT_DOUBLE_EQ(PredictPlanTime(r, w, true, OffloadDevice::kCpu, 3).lanes[2].second, -0.5);
  EXPECT_DOUBLE_EQ(PredictPlanTime(r, w, true, OffloadDevice::kCpu, 2).lanes[2].second, 1.0);
  EXPECT_DOUBLE_EQ(PredictPlanTime(r, w, true, OffloadDevice::kCpu, 3).serial_s, 0.5);
  // The device optimizer's and the split's rest at stage 3 move by the host's
  // difference: -1.5 ns.
  r.device_optimizer = r.device_split = {2e9, 2e-9, 1.0};
  EXPECT_DOUBLE_EQ(PredictPlanTime(r, w, true, OffloadDevice::kNone, 3).lanes[2].second, 0.5);
  EXPECT_DOUBLE_EQ(PredictPlanTime(r, w, true, OffloadDevice::kNone, 1).lanes[2].second, 2.0);
  w.adam_params_device = 0.5e9;  // half on the device: 0.5 x -0.5 + 0.5 x 0.5
  EXPECT_NEAR(PredictPlanTime(r, w, true, OffloadDevice::kCpu, 3).lanes[2].second, 0.0, 1e-12);
  w.adam_params_device = 0;
  nlohmann::json j = RatesToJson(r);
  Result<LaneRates> back = RatesFromJson(j);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_DOUBLE_EQ(back->host_optimizer_stage3.other_s_per_param, -0.5e-9) << "a negative rest is kept";
  j.erase("host_optimizer_stage3");
  back = RatesFromJson(j);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_DOUBLE_EQ(back->host_optimizer_stage3.other_s_per_param, 1e-9);
  j["host_optimizer"]["optimizer_params_per_s"] = -1;
  EXPECT_FALSE(RatesFromJson(j).ok()) << "only the rest may be negative";
}

// fp32 with both planes on NVMe steps at the calibration whose master is the parameter
// shard; every other NVMe optimizer at the plain one.
TEST(PlanTime, ParametersInTheMasterTakeTheirOwnNvmeCalibration) {
  LaneRates r;
  r.nvme_optimizer = {1e9, 1e-9, 1.0};
  r.nvme_optimizer_master = {2e9, 0.5e-9, 1.0};
  LaneWork w = AdamOnly(1e9);
  EXPECT_DOUBLE_EQ(PredictPlanTime(r, w, true, OffloadDevice::kNvme, 3).serial_s, 2.0);
  w.params_in_optimizer_state = true;
  EXPECT_DOUBLE_EQ(PredictPlanTime(r, w, true, OffloadDevice::kNvme, 3).serial_s, 1.0);
  nlohmann::json j = RatesToJson(r);
  j.erase("nvme_optimizer_master");
  Result<LaneRates> back = RatesFromJson(j);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_DOUBLE_EQ(back->nvme_optimizer_master.optimizer_params_per_s, 1e9)
      << "an older profile: the plain one";
}

}  // namespace
}  // namespace strata::tools
