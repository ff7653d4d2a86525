// Google Benchmark of GPT-2 BPE encoding (model::BpeTokenizer) over the default corpus,
// with the 2,000-token vocabulary of tests/data/bpe; bench/bpe-peer.py times Hugging Face
// tokenizers on the same text and files (docs/benchmarks.md, "BPE tokenisation").
// A fresh tokenizer per iteration, so every distinct piece is merged once, as `strata
// data prepare --bpe` does to a corpus (a text this long is encoded in blocks on the
// oneTBB threads, each with a cache of its own).
#include <benchmark/benchmark.h>

#include <fstream>
#include <sstream>
#include <string>

#include "strata/bpe.h"
#include "strata/token_data.h"

namespace {

const std::string kVocab = std::string(STRATA_SOURCE_DIR) + "/tests/data/bpe/vocab.json";
const std::string kMerges = std::string(STRATA_SOURCE_DIR) + "/tests/data/bpe/merges.txt";

const std::string& Corpus() {
  static const std::string text = [] {
    std::string all;
    auto files = strata::model::DefaultCorpusFiles();
    if (!files.ok()) return all;
    for (const std::string& f : *files) {
      std::ifstream in(f, std::ios::binary);
      std::stringstream s;
      s << in.rdbuf();
      all += s.str();
    }
    return all;
  }();
  return text;
}

void Report(benchmark::State& state, int64_t tokens) {
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(Corpus().size()));
  state.counters["tokens/s"] =
      benchmark::Counter(static_cast<double>(tokens) * state.iterations(), benchmark::Counter::kIsRate);
  state.counters["tokens"] = static_cast<double>(tokens);
}

void BM_Encode(benchmark::State& state) {
  if (Corpus().empty()) return state.SkipWithError("no default corpus (scripts/setup.sh installs it)");
  int64_t tokens = 0;
  for (auto _ : state) {
    auto bpe = strata::model::BpeTokenizer::Load(kVocab, kMerges);
    if (!bpe.ok()) return state.SkipWithError(bpe.status().ToString().c_str());
    auto ids = bpe->Encode(Corpus());
    if (!ids.ok()) return state.SkipWithError(ids.status().ToString().c_str());
    tokens = static_cast<int64_t>(ids->size());
  }
  Report(state, tokens);
}
BENCHMARK(BM_Encode)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace
