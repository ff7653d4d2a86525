// A world of N ranks seen from rank 0, where every peer is taken to hold what this rank
// holds: what `strata plan` creates an engine's plan over, so that the plan for 8 ranks
// can be made in one process without MPI. Every rank of a ZeRO run lays out the same
// model with the same config, so the plan of one rank is the plan of each.
//
// AllGather repeats this rank's contribution; Broadcast and Barrier do nothing; the
// reductions sum or average N equal contributions (fp32 only). Split is Unimplemented.
// Nothing crosses a process. It serves the engine's plan (Engine::Plan) at any size, and
// at size 1 the plan's calibration steps (a one-rank world needs no MPI); training at
// size > 1 over it would compute with data no peer has. One thread at a time.
#pragma once

#include <memory>
#include <string>

#include "strata/comm.h"

namespace strata::tools {

// InvalidArgument unless 1 <= size.
Result<std::unique_ptr<Communicator>> CreateMirrorWorld(int size);

}  // namespace strata::tools
