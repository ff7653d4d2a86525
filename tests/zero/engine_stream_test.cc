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
TEST(EngineStream, Bf16ModesAndRunsHaveASwapOfPieces) {
  CheckStreamModes(World(), R"(, "bf16": {"enabled": true})");
  CheckStreamedRuns(World(), true, R"(, "bf16": {"enabled": true})", "bf16");
}
// Overflowing fp16 steps are skipped: the speculative pieces written are put back from
// the master (RestoreParams through the piece swap).
TEST(EngineStream, Fp16OverflowSkipsAndRestoresThePieces) {
  CheckStreamedRuns(World(), true, R"(, "fp16": {"enabled": true, "initial_scale_power": 24})",
                    "fp16 overflow");
}
// Parameters in host or device memory: no gather reads the disk, and the step's values
// go to the shard a piece at a time through pinned pieces.
TEST(EngineStream, ParametersOffNvmeTakeTheStepsPieces) {
  CheckStreamedRuns(World(), true, "", "parameters on the CPU",
                    Combo{3, "nvme", "cpu", "auto", kPiecedSubGroup});
  CheckStreamedRuns(World(), true, R"(, "bf16": {"enabled": true})", "bf16 parameters on the device",
                    Combo{3, "nvme", "none", "auto", kPiecedSubGroup});
}
TEST(EngineStream, ChunksKeptInMemoryBesideStreamedShardsEqualTheReference) {
  CheckStreamedWithResidentChunks(World());
}

}  // namespace
}  // namespace strata::testing
