// The GPT trained through the engine under mpirun -np 2 and -np 4 (label mpi): the checks
// of engine_gpt_test with every rank training its slice of the global batch, over a
// subset of the combinations that keeps each world size's run short: one per stage
// without offload, optimizer on the CPU at stages 1-2, and at stage 3 the optimizer and
// parameters each on none, cpu and nvme once, with NVMe gradients forced and the
// optimizer stepped in pieces.
#include "engine_gpt_checks.h"
#include "mpi_world.h"

namespace strata::testing {
namespace {

std::vector<Combo> SomeCombos() {
  return {{0, "none", "none"},         {1, "cpu", "none"},
          {2, "none", "none"},         {2, "cpu", "none"},
          {3, "none", "none"},         {3, "cpu", "cpu"},
          {3, "nvme", "nvme", "nvme"}, {3, "nvme", "cpu", "auto", kPiecedSubGroup}};
}

std::vector<GptVariant> Variant(int i) { return {GptVariants()[i]}; }

TEST(EngineGptMpi, TiedHeadMatchesTheReference) { CheckGptVariants(MpiWorld(), Variant(0), SomeCombos()); }

TEST(EngineGptMpi, AccumulationAndClippingMatchTheReference) {
  CheckGptVariants(MpiWorld(), Variant(1), SomeCombos());
}

TEST(EngineGptMpi, RecomputeMatchesTheReference) { CheckGptVariants(MpiWorld(), Variant(2), SomeCombos()); }

TEST(EngineGptMpi, UntiedHeadMatchesTheReference) { CheckGptVariants(MpiWorld(), Variant(3), SomeCombos()); }

TEST(EngineGptMpi, Bf16MatchesTheReference) { CheckGptVariants(MpiWorld(), Variant(4), SomeCombos()); }

}  // namespace
}  // namespace strata::testing
