#include "tools/plan_time.h"

#include <algorithm>

#include "zero/residency_plan.h"

namespace strata::tools {
namespace {

double Over(double work, double rate) { return work > 0 && rate > 0 ? work / rate : 0.0; }

double DiskSeconds(const LaneRates& r, double read, double write) {
  return r.nvme_mixed_bytes_per_s > 0
             ? Over(read + write, r.nvme_mixed_bytes_per_s)
             : Over(read, r.nvme_read_bytes_per_s) + Over(write, r.nvme_write_bytes_per_s);
}

using Lanes = std::vector<std::pair<std::string, double>>;

struct Phase {
  double seconds = 0;
  std::string critical;
};

// An overlapped stretch of the step: on shared cores max(cpu x factor + gather reads,
// disk); on a GPU the slowest lane, the compute with its gather reads.
Phase Overlap(const Lanes& lanes, double gathers, double disk, double factor, bool shared_cpu) {
  Phase p;
  if (shared_cpu) {
    double cpu = 0;
    for (const auto& [name, s] : lanes) cpu += name == "nvme_read" || name == "nvme_write" ? 0 : s;
    p.seconds = std::max(cpu * factor + gathers, disk);
    p.critical = cpu * factor + gathers >= disk ? (gathers > 0 ? "cpu + gather reads" : "cpu") : "nvme";
    return p;
  }
  p.seconds = disk;
  p.critical = "nvme";
  for (const auto& [name, s] : lanes) {
    const double path = name == "compute" ? s + gathers : s;
    if (name == "nvme_read" || name == "nvme_write" || path <= p.seconds) continue;
    p.seconds = path;
    p.critical = name == "compute" && gathers > 0 ? "compute + gather reads" : name;
  }
  return p;
}

// The NVMe optimizer's pipeline with fewer than kMinStagingSets staging sets: each
// piece's read, step and write follow one another, where the mixed rate assumes the
// disk always has both in flight. What that adds to the disk's time.
double SerialPipelineExtra(const LaneRates& r, const LaneWork::StatePipeline& p, double adam_per_s) {
  if (p.staging_sets <= 0 || p.staging_sets >= zero::kMinStagingSets) return 0;
  const double serial = Over(p.read_bytes, r.nvme_read_bytes_per_s) +
                        Over(p.write_bytes, r.nvme_write_bytes_per_s) + Over(p.params, adam_per_s);
  return std::max(0.0, serial - DiskSeconds(r, p.read_bytes, p.write_bytes));
}

}  // namespace

PlanTime PredictPlanTime(const LaneRates& r, const LaneWork& w, bool shared_cpu, OffloadDevice opt_device,
                         int stage) {
  PlanTime t;
  const EngineRates& host = stage == 3 ? r.host_optimizer_stage3 : r.host_optimizer;
  // The device optimizer is calibrated at stage 0 and a CPU optimizer's device split at
  // stage 1. At stage 3 their rest takes what stage 3 adds per parameter to the host
  // optimizer's (the gathers beside the compute, the hooks).
  const double stage3 =
      stage == 3 ? r.host_optimizer_stage3.other_s_per_param - r.host_optimizer.other_s_per_param : 0;
  EngineRates d = r.device_optimizer, split = r.device_split;
  d.other_s_per_param += stage3;
  split.other_s_per_param += stage3;
  const EngineRates& nvme = w.params_in_optimizer_state ? r.nvme_optimizer_master : r.nvme_optimizer;
  const EngineRates& e = opt_device == OffloadDevice::kNone  ? d
                         : opt_device == OffloadDevice::kCpu ? host
                                                             : nvme;
  auto adam_rate = [&](const EngineRates& x) {
    return x.optimizer_params_per_s > 0 ? x.optimizer_params_per_s : r.adam_params_per_s;
  };
  // A CPU optimizer's device chunks (offload_optimizer.ratio) step at the split's rates.
  const double on_device = opt_device == OffloadDevice::kCpu ? w.adam_params_device : 0;
  const double optimizer = Over(w.adam_params - on_device, adam_rate(e)) + Over(on_device, adam_rate(split));
  const double other =
      (w.adam_params - on_device) * e.other_s_per_param + on_device * split.other_s_per_param;
  const double copies = Over(w.copy_bytes, r.copy_bytes_per_s);
  const double comm = Over(w.comm_bytes, r.copy_bytes_per_s);  // one machine: memory traffic
  const double rd = Over(w.nvme_read_bytes, r.nvme_read_bytes_per_s);
  const double wr = Over(w.nvme_write_bytes, r.nvme_write_bytes_per_s);
  t.lanes = {{"compute", w.compute_s}, {"optimizer", optimizer}, {"other", other},  {"copies", copies},
             {"collectives", comm},    {"nvme_read", rd},        {"nvme_write", wr}};
  for (const auto& [name, s] : t.lanes) t.serial_s += s;
  t.disk_s = DiskSeconds(r, w.nvme_read_bytes, w.nvme_write_bytes) +
             SerialPipelineExtra(r, w.nvme_state, adam_rate(nvme));
  t.cpu_s = w.compute_s + optimizer + other + copies + comm;
  const double factor = e.overlap_factor > 0 ? e.overlap_factor : 1.0;
  // The forward and backward wait for their gathers' reads: on the cores' path, while
  // the disk's own total already counts those bytes.
  const double gathers = Over(w.nvme_param_read_bytes, r.nvme_read_bytes_per_s);
  const Phase whole = Overlap(t.lanes, gathers, t.disk_s, factor, shared_cpu);
  t.overlapped_s = whole.seconds;
  t.critical = whole.critical;
  const double between = DiskSeconds(r, w.nvme_between_read_bytes, w.nvme_between_write_bytes);
  if (w.micro_batches > 1 && between > 0) {
    // The gradient shards of the first a-1 micro-batches go to disk and back while those
    // micro-batches run; the state's reads and writes wait for the last one's backward
    // (the speculative step). Two phases, each as fast as its slowest resource. The
    // shards' reads are on the backward's path, as the gathers' are: the reduction reads
    // a shard back before it adds the micro-batch's gradient to it, and the backward
    // waits for the buffers the reduction holds meanwhile.
    const double f = static_cast<double>(w.micro_batches - 1) / w.micro_batches;
    const double shard_reads = Over(w.nvme_between_read_bytes, r.nvme_read_bytes_per_s);
    Lanes first = t.lanes, last = t.lanes;
    for (size_t i = 0; i < t.lanes.size(); ++i) {
      const std::string& name = t.lanes[i].first;
      const bool per_micro_batch = name == "compute" || name == "copies" || name == "collectives";
      first[i].second = per_micro_batch ? f * t.lanes[i].second : 0;
      last[i].second = t.lanes[i].second - first[i].second;
    }
    const Phase a = Overlap(first, f * gathers + shard_reads, between, factor, shared_cpu);
    const Phase b = Overlap(last, (1 - f) * gathers, std::max(0.0, t.disk_s - between), factor, shared_cpu);
    t.accumulation_s = a.seconds;
    t.overlapped_s = a.seconds + b.seconds;
    t.critical = b.critical + " (micro-batches before the last: " + a.critical + ")";
  }
  return t;
}

nlohmann::json ToJson(const PlanTime& t) {
  nlohmann::json lanes = nlohmann::json::object();
  for (const auto& [name, s] : t.lanes) lanes[name] = s;
  return {{"lanes_s", lanes},
          {"cpu_s", t.cpu_s},
          {"disk_s", t.disk_s},
          {"serial_s", t.serial_s},
          {"overlapped_s", t.overlapped_s},
          {"accumulation_s", t.accumulation_s},
          {"critical", t.critical}};
}

}  // namespace strata::tools
