// The engine's model-agnostic interface under mpirun -np 2 and -np 4 (label mpi): the
// checks of engine_model_test with every rank training its slice of the global batch.
#include "engine_model_checks.h"
#include "mpi_world.h"

namespace strata::testing {
namespace {

Communicator& World() { return MpiWorld(); }

TEST(EngineModelMpi, TiedWeightMatchesTheReference) { CheckTiedWeight(World(), AllCombos()); }
TEST(EngineModelMpi, RecomputedBlocksMatchTheReference) { CheckRecompute(World(), AllCombos()); }
TEST(EngineModelMpi, FrozenModulesMatchTheReference) { CheckFrozen(World(), AllCombos()); }
TEST(EngineModelMpi, ModuleCalledTwiceMatchesTheReference) { CheckCalledTwice(World(), AllCombos()); }
TEST(EngineModelMpi, TensorLargerThanAChunkMatchesTheReference) {
  CheckTensorLargerThanAChunk(World(), AllCombos());
}
TEST(EngineModelMpi, ChangingCallOrderMatchesTheReference) { CheckOrderChanges(World(), AllCombos()); }
TEST(EngineModelMpi, GradientsHandedInMatchTheReference) { CheckExternalGradients(World(), AllCombos()); }

}  // namespace
}  // namespace strata::testing
