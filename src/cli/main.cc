// `strata`: one binary, subcommands (info, bench ..., later train and ckpt).
#include <CLI/CLI.hpp>
#include <cstdio>

#include "cli/commands.h"
#include "strata/log.h"

int main(int argc, char** argv) {
  strata::InitLoggingFromEnv();
  CLI::App app{"strata: ZeRO training with tiered GPU / pinned host / NVMe memory"};
  app.require_subcommand(1);
  strata::cli::AddInfoCommand(app);
  strata::cli::AddTrainCommand(app);
  strata::cli::AddDataCommand(app);
  strata::cli::AddCkptCommand(app);
  strata::cli::AddPlanCommand(app);
  CLI::App* bench = app.add_subcommand("bench", "offload-bandwidth benchmarks, each figure beside its limit");
  bench->require_subcommand(1);
  strata::cli::AddBenchPcieCommand(*bench);
  strata::cli::AddBenchAdamCommand(*bench);
  strata::cli::AddBenchIoCommand(*bench);
  strata::cli::AddBenchCommCommand(*bench);
  strata::cli::AddBenchStepCommand(*bench);
  strata::cli::AddBenchSwapCommand(*bench);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const strata::cli::CliError& e) {
    std::fprintf(stderr, "strata: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
