// The engine's model-agnostic interface under mpirun -np 2 and -np 4 (label mpi): the
// checks of engine_model_test with every rank training its slice of the global batch.
#include "engine_model_checks.h"
#include "mpi_world.h"

namespace strata::testing {
namespace {

Communicator& World() { return MpiWorld(); }

TEST(EngineModelMpi, TiedWeightMatchesTheReference) {
  CheckTiedWeight(World(), CombosWithoutParamResidency());
}
TEST(EngineModelMpi, RecomputedBlocksMatchTheReference) {
  CheckRecompute(World(), CombosWithoutParamResidency());
}
TEST(EngineModelMpi, FrozenModulesMatchTheReference) { CheckFrozen(World(), CombosWithoutParamResidency()); }
TEST(EngineModelMpi, ModuleCalledTwiceMatchesTheReference) {
  CheckCalledTwice(World(), CombosWithoutParamResidency());
}
TEST(EngineModelMpi, TensorLargerThanAChunkMatchesTheReference) {
  CheckTensorLargerThanAChunk(World(), CombosWithoutParamResidency());
}
TEST(EngineModelMpi, ChangingCallOrderMatchesTheReference) {
  CheckOrderChanges(World(), CombosWithoutParamResidency());
}
TEST(EngineModelMpi, GradientsHandedInMatchTheReference) {
  CheckExternalGradients(World(), CombosWithoutParamResidency());
}

}  // namespace
}  // namespace strata::testing
