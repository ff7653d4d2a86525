// The medians of `strata bench step --repeat`, on reports with chosen figures.
#include "tools/step_bench.h"

#include <gtest/gtest.h>
#include <sys/mman.h>

#include <cstring>

#include "strata/disk_stats.h"
#include "zero/engine_harness.h"
#include "zero/single_world.h"

namespace strata::tools {
namespace {

// The harness's small MLP, as `strata bench step` runs it.
void SetSmallModel(StepBenchOptions* o, int steps) {
  const zero::TrainSpec spec = testing::SmallSpec(steps);
  Result<PlanModel> m = MlpPlanModel(spec.model);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  o->model = *m;
  o->steps = steps;
  o->micro_batch = spec.micro_batch;
}

nlohmann::json Round(double step_s, double efficiency, double speedup, bool bound_valid = true) {
  nlohmann::json r;
  r["run"]["step_s"] = step_s;
  r["overlap_efficiency"] = efficiency;
  r["overlap_efficiency_mixed"] = efficiency + 0.1;
  r["speedup"] = speedup;
  r["speedup_fraction_of_predicted"] = speedup / 2;
  r["probe_slower_than_step"] = !bound_valid;
  return r;
}

TEST(StepBench, MediansOverRounds) {
  std::string text;
  const nlohmann::json s =
      SummarizeRounds({Round(1.4, 0.80, 1.6), Round(1.2, 0.70, 1.8), Round(1.3, 0.90, 1.7)}, &text);
  const nlohmann::json& m = s["median"];
  EXPECT_DOUBLE_EQ(m["step_s"].get<double>(), 1.3);
  EXPECT_DOUBLE_EQ(m["overlap_efficiency"].get<double>(), 0.80);
  EXPECT_DOUBLE_EQ(m["overlap_efficiency_mixed"].get<double>(), 0.90);
  EXPECT_DOUBLE_EQ(m["speedup"].get<double>(), 1.7);
  EXPECT_DOUBLE_EQ(m["speedup_fraction_of_predicted"].get<double>(), 0.85);
  EXPECT_EQ(s["rounds"].size(), 3u);
  EXPECT_EQ(s["invalid_bound_rounds"].get<int>(), 0);
  EXPECT_NE(text.find("median step"), std::string::npos) << text;
}

// A round whose step beat its bound (both probes in a slow spell) keeps its step time
// and speedup, but its efficiency (1.04 here) must not lift the median of the figures
// measured against the bound.
TEST(StepBench, RoundsWithABoundTheStepBeatAreLeftOutOfTheBoundFigures) {
  std::string text;
  const nlohmann::json s =
      SummarizeRounds({Round(1.4, 0.70, 1.5), Round(1.3, 1.04, 1.9, /*bound_valid=*/false),
                       Round(1.5, 0.80, 1.6), Round(1.6, 0.60, 1.7)},
                      &text);
  const nlohmann::json& m = s["median"];
  EXPECT_DOUBLE_EQ(m["step_s"].get<double>(), 1.45);
  EXPECT_DOUBLE_EQ(m["speedup"].get<double>(), 1.65);
  EXPECT_DOUBLE_EQ(m["overlap_efficiency"].get<double>(), 0.70) << "the median of 0.70, 0.80 and 0.60 only";
  EXPECT_DOUBLE_EQ(m["speedup_fraction_of_predicted"].get<double>(), 0.80);
  EXPECT_EQ(s["invalid_bound_rounds"].get<int>(), 1);
  EXPECT_NE(text.find("not valid"), std::string::npos) << text;
}

// The mixed bound is usually the larger: a step can beat it alone, and then only the
// mixed efficiency of that round is left out.
TEST(StepBench, ARoundThatBeatOnlyTheMixedBoundKeepsItsStrictFigures) {
  nlohmann::json beaten = Round(1.2, 0.95, 1.8);
  beaten["overlap_efficiency_mixed"] = 1.05;
  beaten["mixed_bound_beaten"] = true;
  std::string text;
  const nlohmann::json s = SummarizeRounds({Round(1.4, 0.70, 1.6), beaten, Round(1.3, 0.80, 1.7)}, &text);
  const nlohmann::json& m = s["median"];
  EXPECT_DOUBLE_EQ(m["overlap_efficiency"].get<double>(), 0.80);
  EXPECT_DOUBLE_EQ(m["overlap_efficiency_mixed"].get<double>(), 0.85) << "0.80 and 0.90, not 1.05";
  EXPECT_EQ(s["invalid_bound_rounds"].get<int>(), 1);
  EXPECT_NE(text.find("mixed bound not valid"), std::string::npos) << text;
}

// The disk's busy fraction is a median over the rounds that measured it; a round without
// counters (no block device under the swap directory) is left out, not counted as idle.
TEST(StepBench, DiskBusyIsTheMedianOfTheRoundsThatMeasuredIt) {
  auto with_disk = [](double busy) {
    nlohmann::json r = Round(1.3, 0.8, 1.7);
    r["run"]["disk"] = {{"device", "vda"}, {"busy_fraction", busy}};
    return r;
  };
  nlohmann::json without = Round(1.3, 0.8, 1.7);
  without["run"]["disk"] = {{"unavailable", "no block device"}};
  std::string text;
  const nlohmann::json s =
      SummarizeRounds({with_disk(0.97), without, with_disk(0.91), with_disk(0.99)}, &text);
  EXPECT_DOUBLE_EQ(s["median"]["disk_busy_fraction"].get<double>(), 0.97);
  EXPECT_NE(text.find("disk busy 97%"), std::string::npos) << text;
  const nlohmann::json none = SummarizeRounds({without, Round(1.2, 0.7, 1.6)}, &text);
  EXPECT_FALSE(none["median"].contains("disk_busy_fraction"));
  EXPECT_EQ(text.find("disk busy"), std::string::npos) << text;
}

// The disk line keeps its values in the report's column for short names and stays one
// line for long ones (a name past 16 characters once asked for a string of 2^64 spaces).
TEST(StepBench, DiskLineForShortAndLongDeviceNames) {
  DiskActivity d;
  d.seconds = 2;
  d.busy_fraction = 0.964;
  d.mean_in_flight = 30.4;
  d.read_bytes = 2ull << 30;
  d.write_bytes = 1ull << 30;
  const std::string short_line =
      FormatDiskLine("vda", d, 2, static_cast<double>(3ull << 30));  // 1.5 of 3 GiB/s
  EXPECT_EQ(short_line.find("busy 96%"), std::string("  disk vda").size() + 13) << short_line;
  EXPECT_NE(short_line.find("30.4 requests in flight"), std::string::npos) << short_line;
  EXPECT_NE(short_line.find("1.00 GiB read, 512 MiB written per step"), std::string::npos) << short_line;
  EXPECT_NE(short_line.find("0.50 of the probe's mixed rate"), std::string::npos) << short_line;
  const std::string long_name = "nvme0n1p12-with-a-long-name";
  const std::string long_line = FormatDiskLine(long_name, d, 2, 0);
  EXPECT_EQ(long_line.find("busy"), std::string("  disk ").size() + long_name.size() + 1) << long_line;
  EXPECT_EQ(long_line.find("mixed rate"), std::string::npos) << long_line;
  EXPECT_EQ(long_line.find('\n'), long_line.size() - 1);
}

// A real run with the optimizer and parameters on NVMe reports its swap disk's counters
// over the measured steps; a run with nothing on NVMe says it has none.
TEST(StepBenchRun, ReportsItsSwapDisk) {
  StepBenchOptions o;
  o.config = testing::MakeConfig({3, "nvme", "nvme"});
  SetSmallModel(&o, /*steps=*/2);
  o.compare_serial = false;
  o.measure_rates = false;
  std::string text;
  auto j = RunStepBench(testing::World(), o, &text);
  ASSERT_TRUE(j.ok()) << j.status().ToString();
  const nlohmann::json& disk = (*j)["run"]["disk"];
  auto monitor = DiskMonitor::ForPath(testing::SwapDir());
  if (!monitor.ok()) {
    EXPECT_EQ(disk.value("unavailable", ""), monitor.status().ToString()) << disk.dump();
    EXPECT_NE(text.find("disk                 no counters: "), std::string::npos) << text;
    GTEST_SKIP() << "the swap directory has no block device: " << monitor.status().ToString();
  }
  EXPECT_EQ(disk.value("device", ""), monitor->name()) << disk.dump();
  // Every step writes the optimizer state: the device saw at least strata's writes.
  EXPECT_GE(disk["write_bytes_per_step"].get<uint64_t>(), (*j)["run"]["bytes"]["nvme_write"].get<uint64_t>())
      << disk.dump();
  EXPECT_GE(disk["busy_fraction"].get<double>(), 0.0);
  EXPECT_LE(disk["busy_fraction"].get<double>(), 1.0);
  EXPECT_GT(disk["seconds"].get<double>(), 0.0);
  EXPECT_NE(text.find("disk " + monitor->name()), std::string::npos) << text;

  o.config = testing::MakeConfig({2, "cpu", "none"});
  auto none = RunStepBench(testing::World(), o, &text);
  ASSERT_TRUE(none.ok()) << none.status().ToString();
  EXPECT_EQ((*none)["run"]["disk"].value("unavailable", ""), "no swap directory (nothing on NVMe)");
  EXPECT_EQ(text.find("disk "), std::string::npos) << text;
}

// The measured peak resident set is reported beside the plan's three parts, the
// process's own estimate included (#26 item 3), in the text and the JSON.
TEST(StepBenchRun, ReportsThePeakRssBesideThePlansProcessEstimate) {
  StepBenchOptions o;
  o.config = testing::MakeConfig({3, "cpu", "cpu"});
  SetSmallModel(&o, /*steps=*/1);
  o.compare_serial = false;
  o.measure_rates = false;
  std::string text;
  auto j = RunStepBench(testing::World(), o, &text);
  ASSERT_TRUE(j.ok()) << j.status().ToString();
  const nlohmann::json& run = (*j)["run"];
  const nlohmann::json& p = run["process_estimate"];
  EXPECT_GT(p["base"].get<uint64_t>(), 0u) << "the binary and libraries are resident before the engine";
  EXPECT_GT(p["creation"].get<uint64_t>(), 0u);
  EXPECT_GT(p["activations"].get<uint64_t>(), 0u);
  EXPECT_EQ(p["total"].get<uint64_t>(),
            p["base"].get<uint64_t>() + p["creation"].get<uint64_t>() + p["activations"].get<uint64_t>());
  EXPECT_GE(run["peak_rss_bytes"].get<uint64_t>(), p["base"].get<uint64_t>());
  EXPECT_NE(text.find("process peak RSS"), std::string::npos) << text;
  EXPECT_NE(text.find("+ process "), std::string::npos) << text;
  EXPECT_NE(text.find("binary, libraries and MPI "), std::string::npos) << text;
}

// Each run of bench step measures its own peak: an earlier run's memory, freed, does
// not count against the next one's plan (an overlapped run and then a serial one).
TEST(StepBenchRun, EachRunMeasuresItsOwnPeak) {
  constexpr size_t kBytes = 192u << 20;
  if (!ResetPeakRss()) GTEST_SKIP() << "/proc/self/clear_refs cannot be written here";
  const uint64_t before = PeakRssBytes();
  // Straight from the kernel and back: an allocator may keep what it frees resident
  // (AddressSanitizer's quarantine does).
  void* big = mmap(nullptr, kBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(big, MAP_FAILED);
  std::memset(big, 1, kBytes);  // touched: resident
  EXPECT_GE(PeakRssBytes(), before + kBytes / 2) << "the peak follows the resident set";
  ASSERT_EQ(munmap(big, kBytes), 0);
  ASSERT_TRUE(ResetPeakRss());
  EXPECT_LT(PeakRssBytes(), before + kBytes / 2) << "the freed memory is out of the peak";
}

}  // namespace
}  // namespace strata::tools
