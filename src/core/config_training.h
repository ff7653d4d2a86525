// The config's training-loop blocks, DeepSpeed's `scheduler` and `activation_checkpointing`:
// their readers (called by ParseConfig when the block is present) and canonical JSON
// (for ConfigToJson). Errors name the key path and what is accepted (config.h).
#pragma once

#include <nlohmann/json.hpp>

#include "core/json_reader.h"
#include "strata/lr_schedule.h"
#include "strata/status.h"

namespace strata::core {

// `r` reads the scheduler object `block`: {"type": ..., "params": {...}}.
Status ReadScheduler(JsonReader& r, const nlohmann::json& block, LrSchedule* out);
// The scheduler block that parses back to `s`; null for kConstant (no block).
nlohmann::json SchedulerToJson(const LrSchedule& s);

// `r` reads the activation_checkpointing object `block`; keys whose meaning strata does
// not build are refused when set to anything but DeepSpeed's default.
Status ReadActivationCheckpointing(JsonReader& r, const nlohmann::json& block);
// The block with every key at its default, as an enabled config writes it.
nlohmann::json ActivationCheckpointingToJson();

}  // namespace strata::core
