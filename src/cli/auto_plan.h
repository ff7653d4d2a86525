// `strata train --config auto` (strata.plan "auto"): the stage and offloads chosen by
// `strata plan` for this run's model, world and budgets.
#pragma once

#include <map>
#include <string>

#include "strata/comm.h"
#include "strata/config.h"
#include "tools/plan_model.h"

namespace strata::cli {

// Rank 0 measures the rates and plans `model` (tools/planner.h) over world's size; every
// rank takes its first choice into *config (stage, offload devices, strata.overlap) and
// strata.plan becomes "off". Rank 0 prints the choice and the runners-up on stderr.
// Collective over world: the other ranks wait in a broadcast while rank 0 calibrates
// (seconds to tens of seconds; strata.collective_timeout_s must cover it). Throws
// CliError when nothing fits (rank 0 names each configuration's refusal; the others say
// rank 0 did) or the planning failed.
void ApplyAutoPlan(Communicator& world, const tools::PlanModel& model, Config* config,
                   std::map<std::string, std::string>* origin);

}  // namespace strata::cli
