#include "tools/plan_time.h"

#include <algorithm>

namespace strata::tools {
namespace {

double Over(double work, double rate) { return work > 0 && rate > 0 ? work / rate : 0.0; }

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
  t.disk_s = r.nvme_mixed_bytes_per_s > 0
                 ? Over(w.nvme_read_bytes + w.nvme_write_bytes, r.nvme_mixed_bytes_per_s)
                 : rd + wr;
  t.cpu_s = w.compute_s + optimizer + other + copies + comm;
  const double factor = e.overlap_factor > 0 ? e.overlap_factor : 1.0;
  // The forward and backward wait for their gathers' reads: on the cores' path, while
  // the disk's own total already counts those bytes.
  const double gathers = Over(w.nvme_param_read_bytes, r.nvme_read_bytes_per_s);
  if (shared_cpu) {
    t.overlapped_s = std::max(t.cpu_s * factor + gathers, t.disk_s);
    t.critical =
        t.cpu_s * factor + gathers >= t.disk_s ? (gathers > 0 ? "cpu + gather reads" : "cpu") : "nvme";
  } else {
    t.overlapped_s = t.disk_s;
    t.critical = "nvme";
    for (const auto& [name, s] : t.lanes) {
      const double path = name == "compute" ? s + gathers : s;
      if (name == "nvme_read" || name == "nvme_write" || path <= t.overlapped_s) continue;
      t.overlapped_s = path;
      t.critical = name == "compute" && gathers > 0 ? "compute + gather reads" : name;
    }
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
          {"critical", t.critical}};
}

}  // namespace strata::tools
