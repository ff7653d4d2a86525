// The step-time model's arithmetic on chosen rates, and its probe on a real file.
#include <gtest/gtest.h>

#include <filesystem>

#include "tools/step_model.h"

namespace strata::tools {
namespace {

LaneRates Rates() {
  LaneRates r;
  r.adam_params_per_s = 1e9;
  r.copy_bytes_per_s = 10e9;
  r.nvme_read_bytes_per_s = 3e9;
  r.nvme_write_bytes_per_s = 4e9;
  return r;
}

LaneWork Work() {
  LaneWork w;
  w.compute_s = 0.3;
  w.adam_params = 1e8;    // 0.1 s
  w.copy_bytes = 1e9;     // 0.1 s
  w.comm_bytes = 0;
  w.nvme_read_bytes = 3e9;   // 1 s
  w.nvme_write_bytes = 2e9;  // 0.5 s
  return w;
}

TEST(StepModel, SharedCoresAndOneDiskAreEachOneLane) {
  StepModel m = ModelStep(Rates(), Work(), /*shared_cpu=*/true);
  EXPECT_DOUBLE_EQ(m.cpu_s, 0.3 + 0.1 + 0.1);
  EXPECT_DOUBLE_EQ(m.nvme_s, 1.5);
  EXPECT_DOUBLE_EQ(m.bound_s, 1.5);
  EXPECT_DOUBLE_EQ(m.serial_s, 0.3 + 0.1 + 0.1 + 1.5);
  EXPECT_EQ(m.bound_mixed_s, 0) << "no mixed rate measured, no mixed bound";
}

TEST(StepModel, OnAGpuComputeCopiesAndAdamAreSeparateLanes) {
  LaneWork w = Work();
  w.compute_s = 2.0;
  StepModel m = ModelStep(Rates(), w, /*shared_cpu=*/false);
  EXPECT_DOUBLE_EQ(m.bound_s, 2.0);
  EXPECT_DOUBLE_EQ(m.cpu_s, 0.1);
}

TEST(StepModel, MixedRateTimesReadsAndWritesTogether) {
  LaneRates r = Rates();
  r.nvme_mixed_bytes_per_s = 2.5e9;  // below the additive 3.33 GB/s for this mix
  StepModel m = ModelStep(r, Work(), /*shared_cpu=*/true);
  EXPECT_DOUBLE_EQ(m.nvme_mixed_s, 2.0);
  EXPECT_DOUBLE_EQ(m.bound_mixed_s, 2.0);
  EXPECT_DOUBLE_EQ(m.bound_s, 1.5) << "the strict bound does not change";
}

// Two probes, one in a slow spell of the disk: the bound takes each rate from the probe
// that reached it, so a spell in one probe cannot loosen it.
TEST(StepModel, BestOfTwoProbesTakesEachRateFromEither) {
  LaneRates slow = Rates(), fast = Rates();
  slow.nvme_read_bytes_per_s = 1e9;
  slow.nvme_mixed_bytes_per_s = 2e9;
  fast.nvme_write_bytes_per_s = 2e9;
  fast.nvme_mixed_bytes_per_s = 3e9;
  fast.adam_params_per_s = 2e9;
  for (const LaneRates& b : {BestOf(slow, fast), BestOf(fast, slow)}) {
    EXPECT_EQ(b.nvme_read_bytes_per_s, 3e9);
    EXPECT_EQ(b.nvme_write_bytes_per_s, 4e9);
    EXPECT_EQ(b.nvme_mixed_bytes_per_s, 3e9);
    EXPECT_EQ(b.adam_params_per_s, 2e9);
    EXPECT_EQ(b.copy_bytes_per_s, 10e9);
  }
}

TEST(StepModel, ProbeMeasuresEveryDiskRateOnARealFile) {
  auto dir = std::filesystem::current_path() / "step-model-probe";
  auto r = MeasureLaneRates(dir.string(), 1 << 16, 64ull << 20, 0.6);
  std::filesystem::remove_all(dir);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_GT(r->nvme_read_bytes_per_s, 0);
  EXPECT_GT(r->nvme_write_bytes_per_s, 0);
  EXPECT_GT(r->nvme_mixed_bytes_per_s, 0);
  EXPECT_FALSE(r->nvme_backend.empty());
  EXPECT_FALSE(std::filesystem::exists(dir / "strata-lane-probe.tmp")) << "the probe file is removed";
}

}  // namespace
}  // namespace strata::tools
