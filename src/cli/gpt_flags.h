// `strata train --model gpt`'s own flags: the model's shape, the data, validation,
// sampling and the log; their checks, the model they describe, and the default corpus.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "cli/cli_fwd.h"
#include "cli/gpt_train_job.h"
#include "strata/gpt.h"
#include "strata/status.h"

namespace strata::cli {

// Defaults sized for a few minutes of training on two cores.
struct GptFlags {
  std::string data_dir;  // empty: the fortunes corpus, prepared on first use
  int64_t n_layer = 4, n_head = 4, n_embd = 128, seq = 128, block_size = 0;
  bool untied = false;
  GptRunSettings run;
  std::vector<CLI::Option*> options;  // every flag above, to refuse them with --model mlp
};

// Registers the flags on `cmd`; they live in `g`, which must outlive the App.
void AddGptFlags(CLI::App* cmd, GptFlags* g);
// Only the flags of the model and its data (--data, --n-layer, --n-head, --n-embd,
// --seq, --block-size, --untied): a command that runs steps without validation,
// sampling or a log (`strata bench step`).
void AddGptModelFlags(CLI::App* cmd, GptFlags* g);
// InvalidArgument naming the first flag out of range.
Status CheckGptFlags(const GptFlags& g);
// The model the flags describe, with the byte vocabulary of the token files
// (`vocab_size`) and the initialisation seed. InvalidArgument from model::ValidateSpec.
Result<model::GptSpec> GptSpecFromFlags(const GptFlags& g, int64_t vocab_size, uint64_t seed);

// The token files to train on: DIR/train.tokens and DIR/val.tokens of --data, or of the
// default corpus's directory ($TMPDIR/strata-data), which is prepared from the fortunes
// text when either file is missing (several ranks may do so at once: each writes its
// own temporary and renames the same content). NotFound naming the missing file of an
// explicit --data, with the command that makes it; the errors of model::PrepareTokens.
struct TokenPaths {
  std::string train, val;
  bool prepared = false;  // the default corpus was tokenised by this call
};
Result<TokenPaths> FindOrPrepareData(const GptFlags& g);

}  // namespace strata::cli
