#include "cli/gpt_flags.h"

#include <CLI/CLI.hpp>
#include <filesystem>

#include "strata/token_data.h"

namespace strata::cli {

void AddGptModelFlags(CLI::App* cmd, GptFlags* g) {
  g->options = {
      cmd->add_option(
          "--data", g->data_dir,
          "directory with train.tokens and val.tokens (strata data prepare); default: the fortunes "
          "corpus, prepared into $TMPDIR/strata-data on first use"),
      cmd->add_option("--n-layer", g->n_layer, "GPT blocks")->capture_default_str(),
      cmd->add_option("--n-head", g->n_head, "attention heads")->capture_default_str(),
      cmd->add_option("--n-embd", g->n_embd, "embedding width (a multiple of --n-head)")
          ->capture_default_str(),
      cmd->add_option("--seq", g->seq, "tokens per training sequence")->capture_default_str(),
      cmd->add_option("--block-size", g->block_size, "the model's longest sequence (default: --seq)"),
      cmd->add_flag("--untied", g->untied,
                    "an LM head of its own instead of the token embedding's transpose")};
}

void AddGptFlags(CLI::App* cmd, GptFlags* g) {
  AddGptModelFlags(cmd, g);
  g->options.insert(
      g->options.end(),
      {cmd->add_option(
              "--eval-every", g->run.eval_every,
              "validation loss every N steps, and before the first and after the last (0: only those)")
           ->capture_default_str(),
       cmd->add_option("--eval-batches", g->run.eval_batches, "micro-batches per rank per validation")
           ->capture_default_str(),
       cmd->add_option("--sample", g->run.sample,
                       "tokens of text sampled from the model at the end (0: none)")
           ->capture_default_str(),
       cmd->add_option("--temperature", g->run.temperature, "sampling temperature")->capture_default_str(),
       cmd->add_option("--prompt", g->run.prompt, "text the sample continues (default: a newline)"),
       cmd->add_option("--log", g->run.log_path, "JSON-lines log: one line per step and per validation"),
       cmd->add_option(
           "--init-from", g->run.init_from,
           "start from the weights of a safetensors file (strata ckpt export, or written elsewhere): "
           "every tensor of the model by name and shape; with --resume auto, only when there is "
           "no checkpoint to resume")});
}

Status CheckGptFlags(const GptFlags& g) {
  for (auto [name, v] : {std::pair{"--n-layer", g.n_layer},
                         {"--n-head", g.n_head},
                         {"--n-embd", g.n_embd},
                         {"--seq", g.seq},
                         {"--eval-batches", g.run.eval_batches}}) {
    if (v < 1)
      return InvalidArgumentError(std::string(name) + " " + std::to_string(v) + ": must be at least 1");
  }
  if (g.block_size != 0 && g.block_size < g.seq) {
    return InvalidArgumentError("--block-size " + std::to_string(g.block_size) + " is below --seq " +
                                std::to_string(g.seq) + ": the model could not take the training sequences");
  }
  if (g.n_embd % g.n_head != 0) {
    return InvalidArgumentError("--n-embd " + std::to_string(g.n_embd) + " is not a multiple of --n-head " +
                                std::to_string(g.n_head));
  }
  if (g.run.eval_every < 0)
    return InvalidArgumentError("--eval-every " + std::to_string(g.run.eval_every) + ": must be at least 0");
  if (g.run.sample < 0)
    return InvalidArgumentError("--sample " + std::to_string(g.run.sample) + ": must be at least 0");
  if (!(g.run.temperature > 0)) return InvalidArgumentError("--temperature must be above 0");
  return OkStatus();
}

Result<model::GptSpec> GptSpecFromFlags(const GptFlags& g, int64_t vocab_size, uint64_t seed) {
  model::GptSpec spec;
  spec.vocab_size = vocab_size;
  spec.block_size = g.block_size ? g.block_size : g.seq;
  spec.n_layer = g.n_layer;
  spec.n_head = g.n_head;
  spec.n_embd = g.n_embd;
  spec.tied_head = !g.untied;
  spec.seed = seed;
  STRATA_RETURN_IF_ERROR(model::ValidateSpec(spec));
  return spec;
}

Result<TokenPaths> FindOrPrepareData(const GptFlags& g) {
  namespace fs = std::filesystem;
  const bool by_default = g.data_dir.empty();
  const fs::path dir = by_default ? fs::temp_directory_path() / "strata-data" : fs::path(g.data_dir);
  TokenPaths p{(dir / "train.tokens").string(), (dir / "val.tokens").string()};
  std::error_code ec;
  const bool present = fs::exists(p.train, ec) && fs::exists(p.val, ec);
  if (present) return p;
  if (!by_default) {
    return NotFoundError("--data " + g.data_dir + ": " + (fs::exists(p.train, ec) ? p.val : p.train) +
                         " does not exist; make the token files with `strata data prepare FILES... --out " +
                         g.data_dir + "`");
  }
  STRATA_ASSIGN_OR_RETURN(std::vector<std::string> files, model::DefaultCorpusFiles());
  STRATA_RETURN_IF_ERROR(model::PrepareTokens(files, dir.string()).status());
  p.prepared = true;
  return p;
}

}  // namespace strata::cli
