// The GPT trained through the engine under mpirun -np 2 and -np 4 (label mpi): the checks
// of engine_gpt_test with every rank training its slice of the global batch, over every
// stage and offload combination of engine_gpt_test (AllCombos: each stage, the stage 3
// optimizer x parameter tiers, NVMe and host gradient paths forced, the optimizer
// stepped in pieces, partial residency and the device ratio).
#include "engine_gpt_checks.h"
#include "mpi_world.h"

namespace strata::testing {
namespace {

std::vector<GptVariant> Variant(int i) { return {GptVariants()[i]}; }

TEST(EngineGptMpi, TiedHeadMatchesTheReference) { CheckGptVariants(MpiWorld(), Variant(0), AllCombos()); }

TEST(EngineGptMpi, AccumulationAndClippingMatchTheReference) {
  CheckGptVariants(MpiWorld(), Variant(1), AllCombos());
}

TEST(EngineGptMpi, RecomputeMatchesTheReference) { CheckGptVariants(MpiWorld(), Variant(2), AllCombos()); }

TEST(EngineGptMpi, UntiedHeadMatchesTheReference) { CheckGptVariants(MpiWorld(), Variant(3), AllCombos()); }

TEST(EngineGptMpi, Bf16MatchesTheReference) { CheckGptVariants(MpiWorld(), Variant(4), AllCombos()); }

TEST(EngineGptMpi, AVocabularyLargerThanAChunkMatchesTheReference) {
  CheckGptVariants(MpiWorld(), Variant(5), AllCombos());
}

}  // namespace
}  // namespace strata::testing
