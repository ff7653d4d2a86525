// `strata bench step --repeat N`: the medians over whole rounds (step_bench.h).
#include <algorithm>
#include <cstdio>
#include <map>

#include "strata/units.h"
#include "tools/step_bench.h"

namespace strata::tools {

nlohmann::json SummarizeRounds(const std::vector<nlohmann::json>& rounds, std::string* text) {
  auto median = [](std::vector<double> v) {
    if (v.empty()) return 0.0;
    std::sort(v.begin(), v.end());
    const size_t n = v.size();
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
  };
  const char* against_bound[] = {"overlap_efficiency", "overlap_efficiency_mixed",
                                 "speedup_fraction_of_predicted"};
  std::map<std::string, std::vector<double>> figures;
  int invalid = 0;
  std::string out = "round  step      efficiency  mixed  speedup  of predicted\n";
  for (size_t i = 0; i < rounds.size(); ++i) {
    const nlohmann::json& r = rounds[i];
    const bool valid = !r.value("probe_slower_than_step", false);
    const bool mixed_valid = valid && !r.value("mixed_bound_beaten", false);
    invalid += !mixed_valid;
    figures["step_s"].push_back(r["run"]["step_s"].get<double>());
    if (r.contains("speedup")) figures["speedup"].push_back(r["speedup"].get<double>());
    if (r["run"].contains("disk") && r["run"]["disk"].contains("busy_fraction")) {
      figures["disk_busy_fraction"].push_back(r["run"]["disk"]["busy_fraction"].get<double>());
    }
    for (const char* k : against_bound) {
      const bool mixed = std::string(k) == "overlap_efficiency_mixed";
      if ((mixed ? mixed_valid : valid) && r.contains(k)) figures[k].push_back(r[k].get<double>());
    }
    auto fig = [&](const char* k) {
      return r.contains(k) ? FormatDouble("%.2f", r[k].get<double>()) : std::string("-");
    };
    char line[160];
    std::snprintf(line, sizeof(line), "%5zu  %-8s  %-10s  %-5s  %-7s  %s%s\n", i + 1,
                  FormatSeconds(r["run"]["step_s"].get<double>()).c_str(), fig("overlap_efficiency").c_str(),
                  fig("overlap_efficiency_mixed").c_str(), fig("speedup").c_str(),
                  fig("speedup_fraction_of_predicted").c_str(),
                  valid ? (mixed_valid ? "" : "  (mixed bound not valid: the step beat it)")
                        : "  (bound not valid: the step beat it)");
    out += line;
  }
  nlohmann::json med = nlohmann::json::object();
  for (const auto& [k, v] : figures) {
    if (!v.empty()) med[k] = median(v);
  }
  out += "median step " + FormatSeconds(med.value("step_s", 0.0));
  if (med.contains("overlap_efficiency"))
    out += ", efficiency " + FormatDouble("%.2f", med["overlap_efficiency"].get<double>());
  if (med.contains("overlap_efficiency_mixed")) {
    out += " (mixed " + FormatDouble("%.2f", med["overlap_efficiency_mixed"].get<double>()) + ")";
  }
  if (med.contains("speedup")) out += ", speedup " + FormatDouble("%.2f", med["speedup"].get<double>()) + "x";
  if (med.contains("speedup_fraction_of_predicted")) {
    out += " (" + FormatDouble("%.0f%%", 100 * med["speedup_fraction_of_predicted"].get<double>()) +
           " of predicted)";
  }
  if (med.contains("disk_busy_fraction")) {
    out += ", disk busy " + FormatDouble("%.0f%%", 100 * med["disk_busy_fraction"].get<double>());
  }
  out += " over " + std::to_string(rounds.size()) + " rounds";
  if (invalid) out += "; " + std::to_string(invalid) + " with a bound not valid left out of its figures";
  out += "\n";
  if (text) *text = out;
  return {{"rounds", rounds}, {"median", med}, {"invalid_bound_rounds", invalid}};
}

}  // namespace strata::tools
