#include "cli/gpt_throughput.h"

#include <algorithm>
#include <cstdio>
#include <vector>

#include "strata/units.h"
#include "tools/gemm_rate.h"

namespace strata::cli {

nlohmann::json GptThroughput(const model::GptSpec& spec, int64_t seq, int64_t micro_batch, int world,
                             const nlohmann::json& steps) {
  if (steps.empty()) return nlohmann::json::object();
  const size_t skip = steps.size() > 3 ? 2 : 0;
  std::vector<double> rates;
  for (size_t i = skip; i < steps.size(); ++i) rates.push_back(steps[i]["tokens_per_s"].get<double>());
  std::sort(rates.begin(), rates.end());
  const size_t n = rates.size();
  const double tokens_per_s = n % 2 ? rates[n / 2] : 0.5 * (rates[n / 2 - 1] + rates[n / 2]);
  const double model_flops = tokens_per_s * model::GptFlopsPerSequence(spec, seq) / static_cast<double>(seq) /
                             static_cast<double>(world);
  const tools::GemmRate gemm = tools::MeasureGemmRate(micro_batch * seq, 4 * spec.n_embd, spec.n_embd);
  return {{"tokens_per_s", tokens_per_s},         {"steps_timed", n},
          {"first_step", steps[skip]["step"]},    {"model_flops_per_s", model_flops},
          {"gemm_flops_per_s", gemm.flops_per_s}, {"gemm_shape", gemm.Shape()},
          {"mfu", model_flops / gemm.flops_per_s}};
}

std::string ThroughputLine(const nlohmann::json& t) {
  if (t.empty()) return "throughput: no steps were timed";
  char buf[512];
  const int first = t["first_step"].get<int>(), last = first + t["steps_timed"].get<int>() - 1;
  std::snprintf(
      buf, sizeof(buf),
      "throughput: %s tokens/s (median of step%s %d%s); model flops %.3g GFLOP/s a rank, MFU %.1f%% "
      "of %.3g GFLOP/s, Gemm's best on %s here now",
      FormatCount(t["tokens_per_s"].get<double>()).c_str(), first == last ? "" : "s", first,
      first == last ? "" : ("-" + std::to_string(last)).c_str(), t["model_flops_per_s"].get<double>() / 1e9,
      100.0 * t["mfu"].get<double>(), t["gemm_flops_per_s"].get<double>() / 1e9,
      t["gemm_shape"].get<std::string>().c_str());
  return buf;
}

}  // namespace strata::cli
