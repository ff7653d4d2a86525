// `strata bench adam`: the CPU Adam step in parameters per second and GB/s, for 1..N
// threads, each ISA path this CPU has, fp32 and bf16 gradients, with and without the
// bf16 copy; beside each figure the memory-bandwidth limit measured in the same run (a
// pass with Adam's exact memory traffic and no arithmetic over the same arrays on the
// same threads, optim/bench_support.h) and the fraction of it reached; and a naive loop
// compiled with -fmath-errno as the baseline. Arrays are allocated and touched once
// before timing; every figure is the median of --repeats interleaved runs.
#include <oneapi/tbb/parallel_for.h>
#include <oneapi/tbb/task_arena.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "cli/commands.h"
#include "cli/table.h"
#include "optim/bench_support.h"
#include "strata/adam.h"
#include "strata/cpu_isa.h"
#include "strata/units.h"

namespace strata::cli {
namespace {

using Clock = std::chrono::steady_clock;
using nlohmann::json;

struct AdamBenchOptions {
  std::string params = "256M";
  std::vector<int> threads;       // default 1..hardware threads
  std::vector<std::string> isas;  // default all supported
  int repeats = 5;
  bool json = false;
};

struct Arrays {
  size_t n = 0;
  std::unique_ptr<float[]> p, m, v, g;
  std::unique_ptr<Bf16[]> g16, out;
};

// Allocates and fills (touches) every array once, in parallel, so timing never sees
// first-touch page faults.
Arrays Allocate(size_t n) {
  Arrays a;
  a.n = n;
  a.p.reset(new float[n]);
  a.m.reset(new float[n]);
  a.v.reset(new float[n]);
  a.g.reset(new float[n]);
  a.g16.reset(new Bf16[n]);
  a.out.reset(new Bf16[n]);
  tbb::parallel_for(tbb::blocked_range<size_t>(0, n, size_t{1} << 16),
                    [&](const tbb::blocked_range<size_t>& r) {
                      std::minstd_rand rng(static_cast<uint32_t>(r.begin()));
                      std::uniform_real_distribution<float> u(-1.0f, 1.0f);
                      for (size_t i = r.begin(); i < r.end(); ++i) {
                        a.p[i] = u(rng);
                        a.m[i] = 0.01f * u(rng);
                        a.v[i] = 1e-4f * (1.0f + u(rng));
                        a.g[i] = u(rng);
                        a.g16[i] = FloatToBf16(a.g[i]);
                        a.out[i] = Bf16{0};
                      }
                    });
  return a;
}

struct Row {
  int threads = 0;
  std::string kernel;  // adam | naive | limit
  std::string isa;
  std::string grad;   // f32 | bf16
  bool copy = false;  // bf16 copy of the parameters written
  double bytes_per_param = 0;
  std::vector<double> seconds;  // one per repeat
  double median = 0;
  const Row* limit = nullptr;  // the limit pass with the same copy setting
};

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t k = v.size();
  return k % 2 ? v[k / 2] : 0.5 * (v[k / 2 - 1] + v[k / 2]);
}

std::string LoadAvg() {
  std::ifstream in("/proc/loadavg");
  std::string a, b, c;
  in >> a >> b >> c;
  return a + " " + b + " " + c;
}

void RunAdamBench(const AdamBenchOptions& o) {
  Result<uint64_t> count = ParseCount(o.params);
  if (!count.ok()) ThrowIfError(count.status().WithContext("--params"));
  const size_t n = *count;
  if (n == 0) ThrowIfError(InvalidArgumentError("--params must be > 0"));
  if (o.repeats < 1) ThrowIfError(InvalidArgumentError("--repeats must be >= 1"));

  std::vector<CpuIsa> isas;
  if (o.isas.empty()) {
    isas = SupportedCpuIsas();
  } else {
    for (const std::string& s : o.isas) {
      Result<CpuIsa> isa = ParseCpuIsa(s);
      if (!isa.ok()) ThrowIfError(isa.status().WithContext("--isa"));
      if (!CpuSupports(*isa)) ThrowIfError(UnavailableError("--isa " + s + ": this CPU lacks it"));
      isas.push_back(*isa);
    }
  }
  std::vector<int> threads = o.threads;
  const int hw = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  if (threads.empty()) {
    for (int t = 1; t <= hw; ++t) threads.push_back(t);
  }
  const CpuIsa widest = BestCpuIsa();

  const std::string load_before = LoadAvg();
  const auto t_alloc = Clock::now();
  Arrays a = Allocate(n);
  const double alloc_s = std::chrono::duration<double>(Clock::now() - t_alloc).count();

  AdamParams params;
  params.weight_decay = 0.01f;
  std::vector<Row> rows;
  rows.reserve(threads.size() * (3 + isas.size() * 4));
  for (int t : threads) {
    tbb::task_arena arena(t);
    const size_t first = rows.size();
    // Rows of this thread count; each with the function that runs it once.
    std::vector<std::function<void()>> runs;
    for (bool copy : {false, true}) {
      rows.push_back(
          {t, "limit", std::string(CpuIsaName(widest)), "f32", copy, copy ? 30.0 : 28.0, {}, 0, nullptr});
      runs.push_back([&, copy] {
        ThrowIfError(optim::AdamTrafficPass(widest, a.p.get(), a.m.get(), a.v.get(), a.g.get(),
                                            copy ? a.out.get() : nullptr, n, &arena));
      });
    }
    rows.push_back({t, "naive", "-", "f32", true, 30.0, {}, 0, nullptr});
    runs.push_back([&] {
      optim::AdamStepNaive(params, a.p.get(), a.m.get(), a.v.get(), a.g.get(), a.out.get(), n, &arena);
    });
    for (CpuIsa isa : isas) {
      for (DType gt : {DType::kF32, DType::kBf16}) {
        for (bool copy : {false, true}) {
          const double bpp = (gt == DType::kF32 ? 28.0 : 26.0) + (copy ? 2.0 : 0.0);
          rows.push_back({t,
                          "adam",
                          std::string(CpuIsaName(isa)),
                          std::string(DTypeName(gt)),
                          copy,
                          bpp,
                          {},
                          0,
                          nullptr});
          runs.push_back([&, isa, gt, copy] {
            const GradView g = gt == DType::kF32 ? GradView{a.g.get(), gt} : GradView{a.g16.get(), gt};
            ThrowIfError(AdamStepWithIsa(isa, params, a.p.get(), a.m.get(), a.v.get(), g, n,
                                         copy ? Copy16{a.out.get(), DType::kBf16} : Copy16{}, &arena));
          });
        }
      }
    }
    runs[0]();  // warm the arena's threads
    for (int r = 0; r < o.repeats; ++r) {
      for (size_t k = 0; k < runs.size(); ++k) {
        params.step = r + 1;
        const auto t0 = Clock::now();
        runs[k]();
        rows[first + k].seconds.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
      }
    }
    for (size_t k = first; k < rows.size(); ++k) {
      rows[k].median = Median(rows[k].seconds);
      rows[k].limit = &rows[first + (rows[k].copy ? 1 : 0)];
    }
  }
  const std::string load_after = LoadAvg();

  auto rate = [&](const Row& r) { return static_cast<double>(n) / r.median; };
  auto gbs = [&](const Row& r) { return rate(r) * r.bytes_per_param / 1e9; };
  // Fraction of the limit pass's bandwidth (the same bytes per param for f32 grads, so
  // also the ratio of times; bf16 grads move 2 bytes less per param).
  auto fraction = [&](const Row& r) { return gbs(r) / gbs(*r.limit); };

  if (o.json) {
    json j = {{"benchmark", "adam"},
              {"params", n},
              {"repeats", o.repeats},
              {"statistic", "median"},
              {"hardware_threads", hw},
              {"best_isa", std::string(CpuIsaName(widest))},
              {"loadavg_before", load_before},
              {"loadavg_after", load_after},
              {"allocate_and_touch_s", alloc_s}};
    j["rows"] = json::array();
    for (const Row& r : rows) {
      j["rows"].push_back({{"threads", r.threads},
                           {"kernel", r.kernel},
                           {"isa", r.isa},
                           {"grad", r.grad},
                           {"bf16_copy", r.copy},
                           {"bytes_per_param", r.bytes_per_param},
                           {"median_s", r.median},
                           {"seconds", r.seconds},
                           {"params_per_s", rate(r)},
                           {"gb_per_s", gbs(r)},
                           {"limit_gb_per_s", gbs(*r.limit)},
                           {"fraction_of_limit", fraction(r)}});
    }
    std::cout << j.dump(2) << "\n";
    return;
  }
  std::printf("strata bench adam: %zu params, median of %d runs, loadavg %s -> %s\n", n, o.repeats,
              load_before.c_str(), load_after.c_str());
  Table table(
      {"threads", "kernel", "isa", "grad", "bf16 copy", "Gparams/s", "GB/s", "limit GB/s", "of limit"});
  char b1[32], b2[32], b3[32], b4[32];
  for (const Row& r : rows) {
    std::snprintf(b1, sizeof b1, "%.2f", rate(r) / 1e9);
    std::snprintf(b2, sizeof b2, "%.1f", gbs(r));
    std::snprintf(b3, sizeof b3, "%.1f", gbs(*r.limit));
    std::snprintf(b4, sizeof b4, "%.0f%%", 100 * fraction(r));
    table.AddRow({std::to_string(r.threads), r.kernel, r.isa, r.grad, r.copy ? "yes" : "no", b1, b2, b3, b4});
  }
  std::fputs(table.Render().c_str(), stdout);
}

}  // namespace

void AddBenchAdamCommand(CLI::App& bench) {
  auto opts = std::make_shared<AdamBenchOptions>();
  auto* cmd =
      bench.add_subcommand("adam", "CPU Adam step: params/s and GB/s beside the memory-bandwidth limit");
  cmd->add_option("--params", opts->params, "parameters per array (count: 256M = 256e6; default 256M)");
  cmd->add_option("--threads", opts->threads, "thread counts to run, e.g. 1,2 (default 1..hardware threads)")
      ->delimiter(',');
  cmd->add_option("--isa", opts->isas, "ISA paths to run, e.g. avx2,avx512 (default all this CPU has)")
      ->delimiter(',');
  cmd->add_option("--repeats", opts->repeats, "runs per figure; the median is reported (default 5)");
  cmd->add_flag("--json", opts->json, "print JSON instead of a table");
  cmd->callback([opts] { RunAdamBench(*opts); });
}

}  // namespace strata::cli
