// Streamed shards under mpirun -np 2 and -np 4 (label mpi): the checks of
// engine_stream_test with every rank streaming its own shards.
#include "engine_stream_checks.h"
#include "mpi_world.h"

namespace strata::testing {
namespace {

Communicator& World() { return MpiWorld(); }

TEST(EngineStreamMpi, EachBudgetGetsTheLeastStreamingThatFits) { CheckStreamModes(World()); }
TEST(EngineStreamMpi, StreamedRunsEqualTheReferenceAndTheWholeShardRun) {
  CheckStreamedRuns(World(), true, "", "overlap on");
}
TEST(EngineStreamMpi, StreamedRunsWithClippingEqualTheReference) {
  CheckStreamedRuns(World(), true, R"(, "gradient_clipping": 0.05)", "clipping");
}
TEST(EngineStreamMpi, Bf16RunsHaveASwapOfPieces) {
  CheckStreamedRuns(World(), true, R"(, "bf16": {"enabled": true})", "bf16");
}
TEST(EngineStreamMpi, ChunksKeptInMemoryBesideStreamedShardsEqualTheReference) {
  CheckStreamedWithResidentChunks(World());
}

}  // namespace
}  // namespace strata::testing
