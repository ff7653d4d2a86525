// Stage 3 in fp32 with the optimizer state and the parameters on NVMe, under a host
// budget too small for shard-sized pinned buffers: a gather streams the shard through
// halves of a few pieces, the step keeps no updated shard in memory, and one pinned
// gradient shard waits for the step. The pinned need then no longer grows with the
// module (but for that one gradient shard), and training still equals the reference
// and, bit for bit, the same run with whole shards.
#include "engine_checks.h"
#include "engine_plan.h"
#include "single_world.h"
#include "zero/engine_planner.h"

namespace strata::testing {
namespace {

// Modules of 128 x 128 + 128: each chunk's shard is 18 pieces of kPiecedSubGroup, more
// than the two halves a streamed gather stages.
zero::TrainSpec WideSpec() {
  zero::TrainSpec spec = SmallSpec(6);
  spec.model.input_dim = 128;
  spec.model.hidden = {128, 128, 128};
  return spec;
}

// more: further top-level keys, each with a leading comma.
std::string Budget(uint64_t bytes, bool overlap = true, const std::string& more = "") {
  return R"({"strata": {"host_budget": )" + std::to_string(bytes) + R"(, "overlap": )" +
         (overlap ? "true" : "false") + "}" + more + "}";
}

const Combo kBothOnNvme{3, "nvme", "nvme", "auto", kPiecedSubGroup};

struct Budgets {
  uint64_t pieces = 0;    // the least that plans: gradients to NVMe and back in pieces
  uint64_t streamed = 0;  // the least that streams with one pinned gradient shard
  uint64_t whole = 0;     // the least that plans whole shards
};

Budgets FindBudgets(const zero::TrainSpec& spec, bool overlap = true, const std::string& more = "") {
  Budgets b;
  for (uint64_t bytes = 64 * 1024; bytes <= 16 * 1024 * 1024 && b.whole == 0; bytes += 4 * 1024) {
    auto plan = PlanOnly(MakeConfig(kBothOnNvme, Budget(bytes, overlap, more)), spec);
    if (!plan.ok()) continue;
    if (b.pieces == 0 && plan->gradient_pieces_on_nvme) b.pieces = bytes;
    if (b.streamed == 0 && plan->param_stream_pieces > 0 && !plan->gradient_pieces_on_nvme)
      b.streamed = bytes;
    if (plan->param_stream_pieces == 0) b.whole = bytes;
  }
  return b;
}

TEST(EngineStream, EachBudgetGetsTheLeastStreamingThatFits) {
  const zero::TrainSpec spec = WideSpec();
  const Budgets b = FindBudgets(spec);
  ASSERT_GT(b.pieces, 0u) << "no budget up to 16 MiB plans gradient pieces";
  ASSERT_GT(b.streamed, b.pieces) << "one pinned gradient shard must need more than pieces";
  ASSERT_GT(b.whole, b.streamed) << "whole shards must need more than streaming";
  auto least = PlanOnly(MakeConfig(kBothOnNvme, Budget(b.pieces)), spec);
  auto tight = PlanOnly(MakeConfig(kBothOnNvme, Budget(b.streamed)), spec);
  auto ample = PlanOnly(MakeConfig(kBothOnNvme, Budget(b.whole)), spec);
  ASSERT_TRUE(least.ok() && tight.ok() && ample.ok());
  ASSERT_TRUE(tight->params_in_optimizer_state);
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
  // Whole shards cost 3 staging + 2 kept + 1 more gradient shard; streaming costs 3
  // buffers of two halves of kStreamPieces pieces; gradient pieces cost 6 pieces instead
  // of the last gradient shard.
  const uint64_t shard = tight->shard_elems * 4, piece_bytes = zero::Align4K(piece * 4);
  const uint64_t buffer = zero::Align4K(2 * zero::kStreamPieces * piece * 4);
  EXPECT_GE(b.whole - b.streamed, 6 * shard - 3 * buffer - 4 * 1024);
  const uint64_t grad_pieces = (zero::kGradWritePieces + zero::kGradReadPieces) * piece_bytes;
  EXPECT_GE(b.streamed - b.pieces, shard - grad_pieces - 4 * 1024);
  int found = 0;
  for (const auto& part : least->need_parts) {
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
  EXPECT_EQ(found, 2) << "the plan names the streamed staging and the gradient pieces";
}

// Each budget is the least that plans its mode; training equals the reference and the
// whole-shard run bit for bit (but for clipping's norm with gradient pieces: summed a
// piece at a time), and the host high water stays under the budget, with and without
// overlap and with clipping (a step redone from the gradient read back from NVMe).
void CheckStreamedRuns(bool overlap, const std::string& more, const std::string& what) {
  const zero::TrainSpec spec = WideSpec();
  const Budgets b = FindBudgets(spec, overlap, more);
  ASSERT_GT(b.pieces, 0u) << what;
  ASSERT_GT(b.streamed, b.pieces) << what;
  ASSERT_GT(b.whole, b.streamed) << what;
  auto ref =
      zero::TrainReference(MakeConfig({0, "none", "none"}, "{" + (more.empty() ? "" : more.substr(1)) + "}"),
                           spec, World().size());
  ASSERT_TRUE(ref.ok()) << ref.status().ToString();
  EngineRun whole = RunEngine(World(), MakeConfig(kBothOnNvme, Budget(b.whole, overlap, more)), spec);
  ASSERT_TRUE(whole.status.ok()) << whole.status.ToString();
  const bool clipping = more.find("clipping") != std::string::npos;
  for (uint64_t budget : {b.streamed, b.pieces}) {
    const std::string mode = what + (budget == b.pieces ? ", gradient pieces" : ", one gradient shard");
    auto plan = PlanOnly(MakeConfig(kBothOnNvme, Budget(budget, overlap, more)), spec);
    ASSERT_TRUE(plan.ok()) << plan.status().ToString();
    ASSERT_EQ(plan->param_stream_pieces, zero::kStreamPieces) << mode;
    ASSERT_EQ(plan->gradient_pieces_on_nvme, budget == b.pieces) << mode;
    EngineRun run = RunEngine(World(), MakeConfig(kBothOnNvme, Budget(budget, overlap, more)), spec);
    ExpectMatchesReference(run, *ref, 1e-5, kAtol, kRtol, mode);
    if (!clipping || budget != b.pieces) {
      EXPECT_TRUE(BitIdentical(run, whole)) << mode << ": streaming changed the arithmetic";
    }
    for (const auto& r : run.log.results) EXPECT_LE(r.host_high_water, budget) << mode;
  }
}

TEST(EngineStream, StreamedRunsEqualTheReferenceAndTheWholeShardRun) {
  CheckStreamedRuns(true, "", "overlap on");
}
TEST(EngineStream, StreamedSerialRunsEqualTheReference) { CheckStreamedRuns(false, "", "overlap off"); }
TEST(EngineStream, StreamedRunsWithClippingEqualTheReference) {
  CheckStreamedRuns(true, R"(, "gradient_clipping": 0.05)", "clipping");
}

// Chunks kept in memory (strata.optimizer_resident) beside streamed shards step on the
// memory path; their gathers copy the master from memory, so no compute copy is written.
TEST(EngineStream, ChunksKeptInMemoryBesideStreamedShardsEqualTheReference) {
  const zero::TrainSpec spec = WideSpec();
  auto config = [](uint64_t bytes) {
    return MakeConfig(kBothOnNvme, R"({"strata": {"optimizer_resident": 0.5, "host_budget": )" +
                                       std::to_string(bytes) + "}}");
  };
  uint64_t budget = 0;
  for (uint64_t bytes = 64 * 1024; bytes <= 16 * 1024 * 1024 && budget == 0; bytes += 4 * 1024) {
    auto plan = PlanOnly(config(bytes), spec);
    if (plan.ok()) budget = bytes;
  }
  ASSERT_GT(budget, 0u) << "no budget up to 16 MiB plans half the chunks in memory";
  auto plan = PlanOnly(config(budget), spec);
  ASSERT_TRUE(plan.ok());
  ASSERT_GT(plan->param_stream_pieces, 0) << "the least budget must stream";
  ASSERT_GT(plan->optimizer_resident_chunks, 0);
  auto ref = zero::TrainReference(MakeConfig({0, "none", "none"}), spec, World().size());
  ASSERT_TRUE(ref.ok()) << ref.status().ToString();
  EngineRun run = RunEngine(World(), config(budget), spec);
  ExpectMatchesReference(run, *ref, 1e-5, kAtol, kRtol, "streamed with resident chunks");
  for (const auto& r : run.log.results) EXPECT_LE(r.host_high_water, budget);
}

}  // namespace
}  // namespace strata::testing
