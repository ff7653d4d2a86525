// `strata train --config auto` (strata.plan "auto"): the stage and offloads chosen by
// `strata plan` for this run's model, world and budgets.
#pragma once

#include <map>
#include <string>

#include "cli/train_flags.h"

namespace strata::cli {

// Rank 0 measures the rates and plans (tools/planner.h) over p->world's size; every rank
// takes its first choice into p->config (stage, offload devices, strata.overlap) and
// strata.plan becomes "off". Rank 0 prints the choice and the runners-up on stderr.
// Collective over p->world. Throws CliError when nothing fits (rank 0 names each
// configuration's refusal; the others say rank 0 did).
void ApplyAutoPlan(Prepared* p, std::map<std::string, std::string>* origin);

}  // namespace strata::cli
