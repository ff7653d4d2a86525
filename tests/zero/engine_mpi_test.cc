// The engine against the reference under mpirun -np 2 and -np 4 (label mpi).
#include "engine_checks.h"

namespace strata::testing {
namespace {

Communicator& World() {
  static std::unique_ptr<Communicator> world = [] {
    auto w = InitWorld(CommOptions{"world", 120});
    STRATA_CHECK_MSG(w.ok(), w.status().ToString());
    return std::move(*w);
  }();
  return *world;
}

TEST(EngineMpi, EveryStageAndOffloadMatchesTheReference) { CheckAllCombos(World()); }
TEST(EngineMpi, OverlappedStepEqualsSerialStep) { CheckOverlapEqualsSerial(World(), ""); }
TEST(EngineMpi, OverlappedStepEqualsSerialStepWhenClipping) {
  CheckOverlapEqualsSerial(World(), R"({"gradient_clipping": 0.05})");
}
TEST(EngineMpi, AccumulationEqualsLargerBatch) { CheckAccumulation(World()); }
TEST(EngineMpi, ClippingMatchesTheReference) { CheckClipping(World()); }
TEST(EngineMpi, Fp16OverflowStepsAreSkippedAsInTheReference) { CheckFp16Overflow(World()); }
TEST(EngineMpi, Bf16MatchesTheReference) { CheckBf16(World()); }

}  // namespace
}  // namespace strata::testing
