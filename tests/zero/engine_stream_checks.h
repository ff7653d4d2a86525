// Checks of streamed shards (stage 3, fp32, the optimizer state and the parameters on
// NVMe, under a host budget too small for shard-sized pinned buffers), on any world:
// each budget gets the least streaming that fits, and training equals the reference
// and, bit for bit, the same run with whole shards. engine_stream_test runs them at
// world size 1, engine_stream_mpi_test under mpirun.
#pragma once

#include <functional>

#include "engine_checks.h"
#include "strata/model.h"
#include "zero/engine_planner.h"

namespace strata::testing {

// Modules of 256 x 256 + 256: a chunk's shard is 66 pieces of kPiecedSubGroup at one
// rank and 17 at four, more than the two halves a streamed gather stages.
inline zero::TrainSpec WideSpec() {
  zero::TrainSpec spec = SmallSpec(4);
  spec.model.input_dim = 256;
  spec.model.hidden = {256, 256, 256};
  return spec;
}

// more: further top-level keys, each with a leading comma.
inline std::string StreamBudget(uint64_t bytes, bool overlap = true, const std::string& more = "") {
  return R"({"strata": {"host_budget": )" + std::to_string(bytes) + R"(, "overlap": )" +
         (overlap ? "true" : "false") + "}" + more + "}";
}

inline const Combo kBothOnNvme{3, "nvme", "nvme", "auto", kPiecedSubGroup};

// The plan of an engine created on `world` (collective), without training it.
inline Result<EngineLayoutInfo> PlanOn(Communicator& world, const Config& config,
                                       const zero::TrainSpec& spec) {
  DeviceOptions dopt;
  dopt.kind = DeviceKind::kSim;
  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<Device> device, CreateDevice(dopt));
  auto init = [&](TensorId id, int64_t b, int64_t n, float* out) {
    model::InitMlpTensor(spec.model, id, b, n, out);
  };
  STRATA_ASSIGN_OR_RETURN(
      std::unique_ptr<Engine> engine,
      Engine::Create(config, model::MlpModules(spec.model), init, EngineResources{&world, device.get()}));
  return engine->layout_info();
}

// The search's step, and so how far each budget found may lie above the least.
inline constexpr uint64_t kBudgetStep = 8 * 1024;

struct StreamBudgets {
  uint64_t pieces = 0;    // the least that plans: gradients to NVMe and back in pieces
  uint64_t streamed = 0;  // the least that streams with one pinned gradient shard
  uint64_t whole = 0;     // the least that plans whole shards
};

// The least budget (in kBudgetStep steps, up to 16 MiB) whose plan `reaches`, which
// must be monotonic in the budget: a bisection, as each plan creates an engine.
inline uint64_t LeastBudget(const std::function<bool(uint64_t)>& reaches) {
  uint64_t lo = 64 * 1024 / kBudgetStep, hi = 16 * 1024 * 1024 / kBudgetStep;
  if (!reaches(hi * kBudgetStep)) return 0;
  while (lo < hi) {
    const uint64_t mid = (lo + hi) / 2;
    if (reaches(mid * kBudgetStep)) {
      hi = mid;
    } else {
      lo = mid + 1;
    }
  }
  return lo * kBudgetStep;
}

inline StreamBudgets FindStreamBudgets(Communicator& world, const zero::TrainSpec& spec, bool overlap = true,
                                       const std::string& more = "", const Combo& combo = kBothOnNvme) {
  // 0: refused; 1: gradient pieces; 2: one gradient shard; 3: whole shards.
  auto mode = [&](uint64_t bytes) {
    auto plan = PlanOn(world, MakeConfig(combo, StreamBudget(bytes, overlap, more)), spec);
    if (!plan.ok()) return 0;
    if (plan->param_stream_pieces == 0) return 3;
    return plan->gradient_pieces_on_nvme ? 1 : 2;
  };
  StreamBudgets b;
  b.pieces = LeastBudget([&](uint64_t bytes) { return mode(bytes) >= 1; });
  b.streamed = LeastBudget([&](uint64_t bytes) { return mode(bytes) >= 2; });
  b.whole = LeastBudget([&](uint64_t bytes) { return mode(bytes) >= 3; });
  if (mode(b.pieces) != 1) b.pieces = 0;  // the least budget that plans does not take pieces
  return b;
}

// The least budget plans gradient pieces (named, and no gradient shard), a larger one one
// pinned gradient shard, a larger one whole shards, and each saves what it should.
// more: top-level keys as in StreamBudget (the compute type: fp32 when none).
inline void CheckStreamModes(Communicator& world, const std::string& more = "") {
  const zero::TrainSpec spec = WideSpec();
  const bool fp32 = more.find("bf16") == std::string::npos && more.find("fp16") == std::string::npos;
  const uint64_t cs = fp32 ? 4 : 2;
  const StreamBudgets b = FindStreamBudgets(world, spec, true, more);
  ASSERT_GT(b.pieces, 0u) << "no budget up to 16 MiB plans gradient pieces";
  ASSERT_GT(b.streamed, b.pieces) << "one pinned gradient shard must need more than pieces";
  ASSERT_GT(b.whole, b.streamed) << "whole shards must need more than streaming";
  auto least = PlanOn(world, MakeConfig(kBothOnNvme, StreamBudget(b.pieces, true, more)), spec);
  auto tight = PlanOn(world, MakeConfig(kBothOnNvme, StreamBudget(b.streamed, true, more)), spec);
  auto ample = PlanOn(world, MakeConfig(kBothOnNvme, StreamBudget(b.whole, true, more)), spec);
  ASSERT_TRUE(least.ok() && tight.ok() && ample.ok());
  ASSERT_EQ(tight->params_in_optimizer_state, fp32);
  const int64_t pieces = tight->optimizer_pieces, piece = tight->optimizer_piece_elems;
  ASSERT_GE(pieces, 16) << "the module must be many pieces for this test to mean anything";
  EXPECT_EQ(least->param_stream_pieces, zero::kStreamPieces);
  EXPECT_TRUE(least->gradients_on_nvme);
  EXPECT_EQ(tight->param_stream_pieces, zero::kStreamPieces);
  EXPECT_FALSE(tight->gradient_pieces_on_nvme);
  EXPECT_EQ(tight->fresh_param_shards, 0) << "a streamed step keeps no shard";
  EXPECT_EQ(ample->param_stream_pieces, 0);
  EXPECT_FALSE(ample->gradient_pieces_on_nvme);
  EXPECT_GT(ample->fresh_param_shards, 0);
  // Whole shards cost 3 staging + 2 kept (or written behind) compute shards and 1 more
  // gradient shard; streaming costs 3 buffers of two halves of kStreamPieces pieces (and,
  // with a parameter swap, kStreamWritePieces pieces on their way to it); gradient pieces
  // cost 6 pieces instead of the last gradient shard.
  const uint64_t shard = tight->shard_elems * 4, piece_bytes = zero::Align4K(piece * 4);
  const uint64_t slot16 = zero::Align4K(piece * cs), buffer = 2 * zero::kStreamPieces * slot16;
  const uint64_t param_writes = fp32 ? 0 : zero::kStreamWritePieces * slot16;
  EXPECT_GE(b.whole - b.streamed,
            5 * tight->shard_elems * cs + shard - 3 * buffer - param_writes - kBudgetStep);
  const uint64_t grad_pieces = (zero::kGradWritePieces + zero::kGradReadPieces) * piece_bytes;
  EXPECT_GE(b.streamed - b.pieces, shard - grad_pieces - kBudgetStep);
  int found = 0;
  for (const auto& part : least->need_parts) {
    if (part.what.find("parameters on their way to NVMe") != std::string::npos) {
      ++found;
      EXPECT_EQ(part.bytes, param_writes);
    }
    if (part.what.find("streamed") != std::string::npos) {
      ++found;
      EXPECT_EQ(part.bytes, 3 * buffer);
    }
    if (part.what.find("pinned pieces of fp32 gradients") != std::string::npos) {
      ++found;
      EXPECT_EQ(part.bytes, grad_pieces);
    }
    EXPECT_EQ(part.what.find("gradient shard on its way"), std::string::npos) << part.what;
  }
  EXPECT_EQ(found, fp32 ? 2 : 3) << "the plan names the streamed staging and the pieces";
}

// Each budget is the least that plans its mode; training equals the reference and the
// whole-shard run bit for bit (but for clipping's norm with gradient pieces: summed a
// piece at a time), and the host high water stays under the budget, with and without
// overlap and with clipping (a step redone from the gradient read back from NVMe).
inline void CheckStreamedRuns(Communicator& world, bool overlap, const std::string& more,
                              const std::string& what, const Combo& combo = kBothOnNvme) {
  const zero::TrainSpec spec = WideSpec();
  const StreamBudgets b = FindStreamBudgets(world, spec, overlap, more, combo);
  ASSERT_GT(b.pieces, 0u) << what;
  ASSERT_GT(b.streamed, b.pieces) << what;
  ASSERT_GT(b.whole, b.streamed) << what;
  auto ref = zero::TrainReference(
      MakeConfig({0, "none", "none"}, "{" + (more.empty() ? "" : more.substr(1)) + "}"), spec, world.size());
  ASSERT_TRUE(ref.ok()) << ref.status().ToString();
  EngineRun whole = RunEngine(world, MakeConfig(combo, StreamBudget(b.whole, overlap, more)), spec);
  ASSERT_TRUE(whole.status.ok()) << whole.status.ToString();
  const bool clipping = more.find("clipping") != std::string::npos;
  const bool fp32 = more.find("bf16") == std::string::npos && more.find("fp16") == std::string::npos;
  for (uint64_t budget : {b.streamed, b.pieces}) {
    const std::string mode = what + (budget == b.pieces ? ", gradient pieces" : ", one gradient shard");
    auto plan = PlanOn(world, MakeConfig(combo, StreamBudget(budget, overlap, more)), spec);
    ASSERT_TRUE(plan.ok()) << plan.status().ToString();
    ASSERT_EQ(plan->param_stream_pieces, zero::kStreamPieces) << mode;
    ASSERT_EQ(plan->gradient_pieces_on_nvme, budget == b.pieces) << mode;
    EngineRun run = RunEngine(world, MakeConfig(combo, StreamBudget(budget, overlap, more)), spec);
    if (fp32) {
      ExpectMatchesReference(run, *ref, 1e-5, kAtol, kRtol, mode);
    } else {
      ExpectMatchesReference(run, *ref, 2e-3, 2 * 0.01, 0, mode);  // as CheckBf16
    }
    if (!clipping || budget != b.pieces) {
      EXPECT_TRUE(BitIdentical(run, whole)) << mode << ": streaming changed the arithmetic";
    }
    for (const auto& r : run.log.results) EXPECT_LE(r.host_high_water, budget) << mode;
  }
}

// Chunks kept in memory (strata.optimizer_resident) beside streamed shards step on the
// memory path; their gathers copy the master from memory, so no compute copy is written.
inline void CheckStreamedWithResidentChunks(Communicator& world) {
  const zero::TrainSpec spec = WideSpec();
  auto config = [](uint64_t bytes) {
    return MakeConfig(kBothOnNvme, R"({"strata": {"optimizer_resident": 0.5, "host_budget": )" +
                                       std::to_string(bytes) + "}}");
  };
  const uint64_t budget =
      LeastBudget([&](uint64_t bytes) { return PlanOn(world, config(bytes), spec).ok(); });
  ASSERT_GT(budget, 0u) << "no budget up to 16 MiB plans half the chunks in memory";
  auto plan = PlanOn(world, config(budget), spec);
  ASSERT_TRUE(plan.ok());
  ASSERT_GT(plan->param_stream_pieces, 0) << "the least budget must stream";
  ASSERT_GT(plan->optimizer_resident_chunks, 0);
  auto ref = zero::TrainReference(MakeConfig({0, "none", "none"}), spec, world.size());
  ASSERT_TRUE(ref.ok()) << ref.status().ToString();
  EngineRun run = RunEngine(world, config(budget), spec);
  ExpectMatchesReference(run, *ref, 1e-5, kAtol, kRtol, "streamed with resident chunks");
  for (const auto& r : run.log.results) EXPECT_LE(r.host_high_water, budget);
}

}  // namespace strata::testing
