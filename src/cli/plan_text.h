// Wording shared by `strata plan` and `strata train --config auto`.
#pragma once

#include <string>

#include "strata/config.h"

namespace strata::cli {

// A refusal's first two sentences without the list of what the need is made of: "the
// device tier cannot hold this configuration: it needs 2.55 GiB and has 2.00 GiB
// (strata.device_budget). It grows with the model: ...".
std::string RefusalSummary(std::string refusal);

// The flags that choose a configuration: "--stage 3 --offload-optimizer nvme --offload-param nvme".
std::string ChoiceFlags(const Config& c);

}  // namespace strata::cli
