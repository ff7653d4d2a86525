// Streamed shards at world size 1 (engine_stream_checks.h); engine_stream_mpi_test runs
// the same checks under mpirun.
#include "engine_stream_checks.h"
#include "single_world.h"

namespace strata::testing {
namespace {

TEST(EngineStream, EachBudgetGetsTheLeastStreamingThatFits) { CheckStreamModes(World()); }
TEST(EngineStream, StreamedRunsEqualTheReferenceAndTheWholeShardRun) {
  CheckStreamedRuns(World(), true, "", "overlap on");
}
TEST(EngineStream, StreamedSerialRunsEqualTheReference) {
  CheckStreamedRuns(World(), false, "", "overlap off");
}
TEST(EngineStream, StreamedRunsWithClippingEqualTheReference) {
  CheckStreamedRuns(World(), true, R"(, "gradient_clipping": 0.05)", "clipping");
}
TEST(EngineStream, ChunksKeptInMemoryBesideStreamedShardsEqualTheReference) {
  CheckStreamedWithResidentChunks(World());
}

}  // namespace
}  // namespace strata::testing
