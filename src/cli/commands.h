// Subcommands of the `strata` binary. Each Add* registers one subcommand (its flags
// and its callback) on the given parent; callbacks throw CliError on failure so that
// main() prints the Status and exits non-zero.
#pragma once

#include <stdexcept>

#include "cli/cli_fwd.h"
#include "strata/status.h"

namespace strata::cli {

// Thrown from a subcommand callback; main() prints status and returns 1.
struct CliError : std::runtime_error {
  explicit CliError(Status s) : std::runtime_error(s.ToString()), status(std::move(s)) {}
  Status status;
};
inline void ThrowIfError(const Status& s) {
  if (!s.ok()) throw CliError(s);
}

void AddInfoCommand(CLI::App& app);
void AddTrainCommand(CLI::App& app);
void AddDataCommand(CLI::App& app);
void AddCkptCommand(CLI::App& app);
void AddPlanCommand(CLI::App& app);
void AddBenchStepCommand(CLI::App& bench);
void AddBenchPcieCommand(CLI::App& bench);
void AddBenchAdamCommand(CLI::App& bench);
void AddBenchIoCommand(CLI::App& bench);
void AddBenchCommCommand(CLI::App& bench);
void AddBenchSwapCommand(CLI::App& bench);

}  // namespace strata::cli
