// `strata info`: this machine as strata sees it (placeholder until topology lands).
#include "cli/commands.h"

namespace strata::cli {
void AddInfoCommand(CLI::App& app) {
  auto* cmd = app.add_subcommand("info", "show topology, devices, io_uring and memory limits");
  cmd->callback([] {});
}
void AddBenchPcieCommand(CLI::App& bench) {
  bench.add_subcommand("pcie", "host<->device copy bandwidth");
}
}  // namespace strata::cli
