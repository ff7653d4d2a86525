// The engine test bodies, run at world size 1 (engine_test) and under mpirun -np 2 and
// -np 4 (engine_mpi_test). Every rank runs the same engine calls; every rank computes
// the reference locally (it is deterministic) and checks its own gathered copy.
//
// Tolerances. The reference computes Adam in double (rounded once to fp32) and sums a
// micro-batch's gradient in one pass over its samples; the engine uses the SIMD fp32
// Adam (a few ulps from the reference per step, adam.h) and sums per-rank partial
// gradients (reduce-scatter), a different fp32 summation order. Both differences are
// about 1e-7 relative per step. Over 20 Adam steps with lr = 0.01 an update is at most
// lr per element, and a relative error of 1e-6 in an update gives at most 2e-7 per
// step; we allow atol 2e-5 + rtol 1e-4 on parameters of magnitude ~0.1, which is two
// orders of magnitude above that and two below a single Adam step (1e-2). Losses: rtol
// 1e-5. With 16-bit compute copies an ulp-level difference in a master value can flip
// the rounding of its 16-bit copy (2^-8 relative for bf16), so those runs are compared
// at rtol 2e-3 on losses and atol 2 lr on parameters (a flipped rounding can move an
// element by at most about one Adam step per step it persists).
#pragma once

#include <cstdio>
#include <random>

#include "engine_harness.h"

namespace strata::testing {

constexpr double kAtol = 2e-5, kRtol = 1e-4;

inline void ExpectMatchesReference(const EngineRun& run, const zero::ReferenceRun& ref, double loss_rtol,
                                   double atol, double rtol, const std::string& what) {
  ASSERT_TRUE(run.status.ok()) << what << ": " << run.status.ToString();
  ASSERT_EQ(run.log.losses.size(), ref.log.losses.size()) << what;
  for (size_t i = 0; i < ref.log.losses.size(); ++i) {
    EXPECT_NEAR(run.log.losses[i], ref.log.losses[i], loss_rtol * std::fabs(ref.log.losses[i]))
        << what << ": loss of step " << i;
    EXPECT_EQ(run.log.skipped[i], ref.log.skipped[i]) << what << ": skip of step " << i;
    EXPECT_EQ(run.log.loss_scales[i], ref.log.loss_scales[i]) << what << ": loss scale of step " << i;
  }
  EXPECT_LE(ParamError(run, ref, atol, rtol), 1.0) << what << ": final parameters differ from the reference";
  EXPECT_LE(run.device_high_water, run.device_capacity) << what;
}

inline void CheckCombos(Communicator& world, const std::vector<Combo>& combos) {
  zero::TrainSpec spec = SmallSpec();
  auto ref = zero::TrainReference(MakeConfig({0, "none", "none"}), spec, world.size());
  ASSERT_TRUE(ref.ok()) << ref.status().ToString();
  EXPECT_TRUE(LossWentDown(ref->log.losses)) << "the reference does not learn";
  for (const Combo& c : combos) {
    EngineRun run = RunEngine(world, MakeConfig(c), spec);
    ExpectMatchesReference(run, *ref, 1e-5, kAtol, kRtol,
                           ComboName(c) + " world " + std::to_string(world.size()));
    if (c.resident > 0 && run.status.ok()) {
      // Some chunks on each side, or the partial path was not what ran.
      EXPECT_GT(run.resident_chunks, 0) << ComboName(c);
      EXPECT_LT(run.resident_chunks, run.num_chunks) << ComboName(c);
    }
    if (c.grad_resident > 0 && run.status.ok()) {
      // Shards kept beyond the resident chunks, and some left on the NVMe path.
      EXPECT_GT(run.grad_resident_chunks, 0) << ComboName(c);
      EXPECT_LT(run.resident_chunks + run.grad_resident_chunks, run.num_chunks) << ComboName(c);
    }
    if (c.param_resident > 0 && run.status.ok()) {
      EXPECT_GT(run.param_resident_chunks, 0) << ComboName(c);
      EXPECT_LT(run.param_resident_chunks, run.num_chunks) << ComboName(c);
    }
    if (c.param_on_device > 0 && run.status.ok()) {
      EXPECT_GT(run.param_device_chunks, 0) << ComboName(c);
      EXPECT_LT(run.param_resident_chunks + run.param_device_chunks, run.num_chunks) << ComboName(c);
    }
    if (c.ratio != 1 && run.status.ok()) {
      // The ratio's share of the chunks, rounded to the nearest, left on the device.
      EXPECT_EQ(run.device_chunks, run.num_chunks - static_cast<int>(std::lround(c.ratio * run.num_chunks)))
          << ComboName(c);
      EXPECT_GT(run.device_chunks, 0) << ComboName(c);
    }
    if (run.status.ok()) {
      EXPECT_TRUE(LossWentDown(run.log.losses)) << ComboName(c) << ": loss did not go down";
    }
  }
}

inline void CheckAllCombos(Communicator& world) { CheckCombos(world, AllCombos()); }

// The overlapped step (default) equals the serial one bit for bit: same arithmetic,
// only the schedule differs.
inline void CheckOverlapEqualsSerial(Communicator& world, const std::string& extra) {
  zero::TrainSpec spec = SmallSpec(8);
  for (const Combo& c :
       {Combo{1, "cpu", "none"}, Combo{2, "none", "none"}, Combo{3, "cpu", "cpu"}, Combo{3, "nvme", "nvme"},
        Combo{3, "nvme", "none"}, Combo{3, "nvme", "nvme", "nvme"},
        Combo{3, "nvme", "nvme", "nvme", kPiecedSubGroup}, Combo{3, "nvme", "nvme", "auto", kPiecedSubGroup},
        Combo{2, "cpu", "none", "auto", 0, 0, 0.5}}) {
    nlohmann::json e = extra.empty() ? nlohmann::json::object() : nlohmann::json::parse(extra);
    e["strata"]["overlap"] = false;
    EngineRun serial = RunEngine(world, MakeConfig(c, e.dump()), spec);
    e["strata"]["overlap"] = true;
    EngineRun overlapped = RunEngine(world, MakeConfig(c, e.dump()), spec);
    ASSERT_TRUE(serial.status.ok()) << serial.status.ToString();
    ASSERT_TRUE(overlapped.status.ok()) << overlapped.status.ToString();
    EXPECT_TRUE(BitIdentical(serial, overlapped)) << ComboName(c) << " " << extra;
    // "auto" alternates the two from the second step on and keeps the faster: the same
    // result again, and its serial trial steps speculate nothing.
    e["strata"]["overlap"] = "auto";
    EngineRun tuned = RunEngine(world, MakeConfig(c, e.dump()), spec);
    ASSERT_TRUE(tuned.status.ok()) << tuned.status.ToString();
    EXPECT_TRUE(BitIdentical(serial, tuned)) << ComboName(c) << " auto " << extra;
    ASSERT_GE(tuned.log.results.size(), 5u);
    for (int w = 0; w < 5; ++w) {
      const StepResult& r = tuned.log.results[w];
      EXPECT_EQ(r.overlapped, w < 2 || w % 2 == 1) << ComboName(c) << " auto, step " << w;
      if (!r.overlapped) {
        EXPECT_EQ(r.speculative_steps, 0) << ComboName(c) << " auto, step " << w;
      }
    }
    int speculative = 0, redone = 0;
    for (const auto& r : overlapped.log.results) {
      speculative += r.speculative_steps;
      redone += r.redone_steps;
    }
    EXPECT_GT(speculative, 0) << ComboName(c) << ": nothing was stepped during backward";
    for (const auto& r : serial.log.results) EXPECT_EQ(r.speculative_steps, 0);
    if (extra.find("gradient_clipping") != std::string::npos) {
      EXPECT_GT(redone, 0) << ComboName(c) << ": clipping engaged but no speculative step was redone";
    }
  }
}

inline void CheckAccumulation(Communicator& world) {
  zero::TrainSpec big = SmallSpec(10);
  big.micro_batch = 16;
  zero::TrainSpec small = big;
  small.micro_batch = 4;
  for (const Combo& c : {Combo{2, "cpu", "none"}, Combo{3, "nvme", "cpu"}, Combo{3, "nvme", "none", "nvme"},
                         Combo{3, "nvme", "nvme", "nvme", kPiecedSubGroup},
                         Combo{3, "nvme", "none", "auto", 0, 0, 1, 0, 0, 0.5}}) {
    EngineRun one = RunEngine(world, MakeConfig(c), big);
    EngineRun four = RunEngine(world, MakeConfig(c, R"({"gradient_accumulation_steps": 4})"), small);
    ASSERT_TRUE(one.status.ok()) << one.status.ToString();
    ASSERT_TRUE(four.status.ok()) << four.status.ToString();
    zero::ReferenceRun as_ref{one.log, one.params};
    ExpectMatchesReference(four, as_ref, 1e-5, kAtol, kRtol, ComboName(c) + " accumulation 4 x 2 vs 1 x 8");
  }
}

inline void CheckClipping(Communicator& world) {
  zero::TrainSpec spec = SmallSpec(10);
  const std::string extra = R"({"gradient_clipping": 0.05})";
  auto ref = zero::TrainReference(MakeConfig({0, "none", "none"}, extra), spec, world.size());
  ASSERT_TRUE(ref.ok()) << ref.status().ToString();
  int clipped = 0;
  for (double c : ref->log.clip_coefs) clipped += c < 1;
  ASSERT_GT(clipped, 5) << "the clipping threshold should engage in most steps";
  for (const Combo& c : {Combo{1, "none", "none"}, Combo{2, "cpu", "none"}, Combo{3, "nvme", "nvme"},
                         Combo{3, "nvme", "cpu", "nvme"}, Combo{3, "nvme", "nvme", "nvme", kPiecedSubGroup},
                         Combo{3, "nvme", "nvme", "auto", kPiecedSubGroup, 0, 1, 0, 0, 0.5}}) {
    EngineRun run = RunEngine(world, MakeConfig(c, extra), spec);
    ExpectMatchesReference(run, *ref, 1e-5, kAtol, kRtol, ComboName(c) + " with clipping");
  }
}

inline void CheckFp16Overflow(Communicator& world) {
  zero::TrainSpec spec = SmallSpec(12);
  // 2^24 times gradients of ~1e-2 leave fp16's range: the first steps overflow, are
  // skipped, and the scale backs off (hysteresis 2: the second overflow halves it).
  const std::string extra =
      R"({"fp16": {"enabled": true, "initial_scale_power": 24, "loss_scale_window": 4}})";
  auto ref = zero::TrainReference(MakeConfig({0, "none", "none"}, extra), spec, world.size());
  ASSERT_TRUE(ref.ok()) << ref.status().ToString();
  int skipped = 0;
  for (bool s : ref->log.skipped) skipped += s;
  ASSERT_GT(skipped, 0) << "the reference should overflow at scale 2^24";
  ASSERT_LT(skipped, spec.steps) << "and recover";
  for (const Combo& c :
       {Combo{0, "none", "none"}, Combo{2, "cpu", "none"}, Combo{3, "nvme", "nvme"},
        Combo{3, "nvme", "nvme", "nvme"}, Combo{3, "nvme", "nvme", "auto", kPiecedSubGroup}}) {
    EngineRun run = RunEngine(world, MakeConfig(c, extra), spec);
    ExpectMatchesReference(run, *ref, 2e-3, 2 * 0.01, 0, ComboName(c) + " fp16");
  }
}

inline void CheckBf16(Communicator& world) {
  zero::TrainSpec spec = SmallSpec(12);
  const std::string extra = R"({"bf16": {"enabled": true}})";
  auto ref = zero::TrainReference(MakeConfig({0, "none", "none"}, extra), spec, world.size());
  ASSERT_TRUE(ref.ok()) << ref.status().ToString();
  for (const Combo& c : {Combo{1, "cpu", "none"}, Combo{3, "cpu", "nvme"}, Combo{3, "nvme", "nvme"}}) {
    EngineRun run = RunEngine(world, MakeConfig(c, extra), spec);
    ExpectMatchesReference(run, *ref, 2e-3, 2 * 0.01, 0, ComboName(c) + " bf16");
  }
}

}  // namespace strata::testing

namespace strata::testing {

// Randomized speculation: random stage/offload combinations, clipping thresholds (off,
// always engaged, sometimes engaged) and fp16 loss scales (overflowing or not), each
// run overlapped and serially; the two must agree bit for bit on every step.
inline void CheckRandomizedSpeculation(Communicator& world, uint64_t seed, int runs) {
  std::mt19937_64 rng(seed);
  const std::vector<Combo> combos = AllCombos();
  int speculated = 0, redone = 0, skipped = 0;
  for (int i = 0; i < runs; ++i) {
    const Combo c = combos[rng() % combos.size()];
    nlohmann::json e = nlohmann::json::object();
    const double clips[] = {0.0, 0.02, 0.3, 5.0};
    e["gradient_clipping"] = clips[rng() % 4];
    if (rng() % 2) {
      e["fp16"] = {{"enabled", true},
                   {"initial_scale_power", 8 + static_cast<int>(rng() % 20)},
                   {"loss_scale_window", 2}};
    }
    e["gradient_accumulation_steps"] = 1 + static_cast<int>(rng() % 2);
    zero::TrainSpec spec = SmallSpec(6);
    e["strata"]["overlap"] = false;
    EngineRun serial = RunEngine(world, MakeConfig(c, e.dump()), spec);
    e["strata"]["overlap"] = true;
    EngineRun overlapped = RunEngine(world, MakeConfig(c, e.dump()), spec);
    const std::string what = ComboName(c) + " " + e.dump();
    ASSERT_TRUE(serial.status.ok()) << what << ": " << serial.status.ToString();
    ASSERT_TRUE(overlapped.status.ok()) << what << ": " << overlapped.status.ToString();
    EXPECT_TRUE(BitIdentical(serial, overlapped)) << what;
    EXPECT_EQ(serial.log.skipped, overlapped.log.skipped) << what;
    for (const auto& r : overlapped.log.results) {
      speculated += r.speculative_steps;
      redone += r.redone_steps;
      skipped += r.skipped;
    }
  }
  // The draw must have exercised both outcomes of speculation.
  EXPECT_GT(speculated, 0) << "seed " << seed;
  EXPECT_GT(redone, 0) << "seed " << seed << ": no speculative step was ever rolled back";
  std::printf("seed %llu: %d speculative chunk steps, %d redone, %d skipped steps\n",
              static_cast<unsigned long long>(seed), speculated, redone, skipped);
}

}  // namespace strata::testing
