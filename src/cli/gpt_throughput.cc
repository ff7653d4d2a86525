#include "cli/gpt_throughput.h"

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "strata/units.h"
#include "tools/gemm_rate.h"

namespace strata::cli {

nlohmann::json GptThroughput(const model::GptSpec& spec, int64_t seq, int64_t micro_batch, int world,
                             const nlohmann::json& steps, Backend backend, DType weights) {
  if (steps.empty()) return nlohmann::json::object();
  const size_t skip = steps.size() > 3 ? 2 : 0;
  std::vector<double> rates;
  for (size_t i = skip; i < steps.size(); ++i) rates.push_back(steps[i]["tokens_per_s"].get<double>());
  std::sort(rates.begin(), rates.end());
  const size_t n = rates.size();
  const double tokens_per_s = n % 2 ? rates[n / 2] : 0.5 * (rates[n / 2 - 1] + rates[n / 2]);
  const double model_flops = tokens_per_s * model::GptFlopsPerSequence(spec, seq) / static_cast<double>(seq) /
                             static_cast<double>(world);
  nlohmann::json t = {{"tokens_per_s", tokens_per_s},
                      {"steps_timed", n},
                      {"first_step", steps[skip]["step"]},
                      {"model_flops_per_s", model_flops}};
  const int64_t m = micro_batch * seq, out = 4 * spec.n_embd, in = spec.n_embd;
  const Result<tools::GemmRate> gemm = backend == Backend::kCuda
                                           ? tools::MeasureDeviceGemmRate(m, out, in, weights)
                                           : Result<tools::GemmRate>(tools::MeasureGemmRate(m, out, in));
  if (!gemm.ok()) {
    t["gemm_error"] = gemm.status().ToString();
    return t;
  }
  t["gemm_flops_per_s"] = gemm->flops_per_s;
  t["gemm_shape"] = gemm->Shape();
  t["gemm_library"] = gemm->library;
  t["mfu"] = model_flops / gemm->flops_per_s;
  return t;
}

std::string ThroughputLine(const nlohmann::json& t) {
  if (t.empty()) return "throughput: no steps were timed";
  char buf[512];
  const int first = t["first_step"].get<int>(), last = first + t["steps_timed"].get<int>() - 1;
  std::snprintf(
      buf, sizeof(buf), "throughput: %s tokens/s (median of step%s %d%s); model flops %.3g GFLOP/s a rank",
      FormatCount(t["tokens_per_s"].get<double>()).c_str(), first == last ? "" : "s", first,
      first == last ? "" : ("-" + std::to_string(last)).c_str(), t["model_flops_per_s"].get<double>() / 1e9);
  std::string line = buf;
  if (t.contains("gemm_error")) return line + "; no MFU: " + t["gemm_error"].get<std::string>();
  std::snprintf(buf, sizeof(buf), ", MFU %.1f%% of %.3g GFLOP/s, %s's best on %s here now",
                100.0 * t["mfu"].get<double>(), t["gemm_flops_per_s"].get<double>() / 1e9,
                t["gemm_library"].get<std::string>().c_str(), t["gemm_shape"].get<std::string>().c_str());
  return line + buf;
}

}  // namespace strata::cli
