// The budgets the plan (engine_planner.h) is checked against: the device's, the least
// room any rank has (a collective), and the host's, from the config, the machine or the
// host arena the engine was given.
#include <unistd.h>

#include <algorithm>

#include "strata/host_arena.h"
#include "strata/topology.h"
#include "strata/units.h"
#include "zero/engine_impl.h"

namespace strata {

Result<zero::TierBudget> Engine::Impl::DeviceBudget() {
  // Which chunks are gathered, kept and released must be the same on every rank (each
  // gather is a collective), and a rank that cannot hold the configuration must not
  // leave the others waiting: every rank plans with the least room any rank has.
  const uint64_t capacity = device->capacity(), used = device->allocated();
  STRATA_ASSIGN_OR_RETURN(const uint64_t have, LeastOverRanks(capacity - used));
  zero::TierBudget b{have, "", "raise strata.device_budget to at least {need}"};
  if (config.strata.device_budget != 0 && capacity == config.strata.device_budget) {
    b.source = "strata.device_budget";
  } else if (device->kind() == DeviceKind::kSim) {
    b.source = config.strata.device_budget ? "the sim device's size" : "the sim device's default size";
    b.raise = "set strata.device_budget to at least {need}";
  } else {
    b.source = device->name() + ": 95% of its free memory, strata.device_budget unset";
    b.raise = "free memory on the device or use one with at least {need}";
  }
  if (used > 0) b.source += "; " + FormatBytes(used) + " of " + FormatBytes(capacity) + " already in use";
  if (world_size > 1) b.source += "; the least any of the " + std::to_string(world_size) + " ranks has";
  return b;
}

zero::TierBudget Engine::Impl::HostBudget(bool host_needed) const {
  zero::TierBudget b{config.strata.host_budget, "strata.host_budget",
                     "raise strata.host_budget to at least {need}"};
  if (b.bytes == 0 && (host_needed || arena == nullptr)) {
    auto topo = DiscoverTopology();
    b.raise = "set strata.host_budget to at least {need}";
    if (!topo.ok()) {
      b.bytes = 4 * GiB;
      b.source = "what strata assumes when it cannot read the machine, strata.host_budget unset";
    } else {
      // DefaultHostArenaBytes: the lockable memory, at most half of the machine's.
      b.bytes = DefaultHostArenaBytes(0, *topo);
      uint64_t memory = topo->total_memory_bytes;
      if (memory == 0) memory = static_cast<uint64_t>(sysconf(_SC_PHYS_PAGES)) * sysconf(_SC_PAGESIZE);
      const uint64_t lockable = topo->memlock.lockable_bytes();
      if (lockable < memory / 2) {
        b.source = "the memlock limit (ulimit -l " + FormatBytes(lockable) + "), strata.host_budget unset";
        b.raise = "raise `ulimit -l` and set strata.host_budget to at least {need}";
      } else {
        b.source = "half of this machine's " + FormatBytes(memory) + ", strata.host_budget unset";
      }
    }
  }
  if (arena != nullptr) {
    const uint64_t free = arena->size() - arena->allocated();
    if ((b.bytes ? b.bytes : arena->size()) >= free) {
      b.source = "what is free of the host arena given in EngineResources.host_arena (" + FormatBytes(free) +
                 " of " + FormatBytes(arena->size()) + ")";
      b.raise = "give the engine a host arena with at least {need} free";
    }
    b.bytes = std::min<uint64_t>(b.bytes ? b.bytes : arena->size(), free);
  }
  return b;
}

}  // namespace strata
