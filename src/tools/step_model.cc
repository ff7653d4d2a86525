#include "tools/step_model.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <vector>

#include "strata/adam.h"
#include "strata/host_arena.h"
#include "strata/io.h"
#include "strata/units.h"

namespace strata::tools {
namespace {

double Since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

Result<double> MeasureAdam(int64_t n) {
  std::vector<float> p(n, 0.1f), m(n, 0.0f), v(n, 0.0f), g(n, 0.01f);
  std::vector<uint16_t> out(n);
  AdamParams ap;
  STRATA_RETURN_IF_ERROR(AdamStep(ap, p.data(), m.data(), v.data(), GradView{g.data(), DType::kF32}, n,
                                  Copy16{out.data(), DType::kBf16}));  // first touch
  double best = 1e30;
  for (int i = 0; i < 3; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    ap.step = 2 + i;
    STRATA_RETURN_IF_ERROR(AdamStep(ap, p.data(), m.data(), v.data(), GradView{g.data(), DType::kF32}, n,
                                    Copy16{out.data(), DType::kBf16}));
    best = std::min(best, Since(t0));
  }
  return n / best;
}

double MeasureCopy() {
  const size_t bytes = 64 << 20;
  std::vector<char> a(bytes, 1), b(bytes, 2);
  double best = 1e30;
  for (int i = 0; i < 3; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    std::memcpy(b.data(), a.data(), bytes);
    best = std::min(best, Since(t0));
  }
  return bytes / best;
}

Status MeasureNvme(const std::string& dir, uint64_t probe_bytes, double read_fraction, LaneRates* rates) {
  const uint64_t block = 1 << 20;
  const uint64_t file_bytes = std::max<uint64_t>(probe_bytes / block, 64) * block;
  const int depth = 32;
  IoEngineOptions o;
  o.block_size = block;
  o.queue_depth = depth;
  STRATA_ASSIGN_OR_RETURN(auto io, IoEngine::Create(o));
  rates->nvme_backend = std::string(io->backend_name());
  HostArenaOptions ao;
  ao.bytes = 2 * depth * block;  // the mixed pass reads into one half, writes from the other
  STRATA_ASSIGN_OR_RETURN(auto arena, HostArena::Create(ao));
  IoBufferRegion region{arena->base(), arena->size()};
  // Without fixed buffers the pass still measures, a little slower; not an error here.
  io->RegisterBuffers({&region, 1}).IgnoreError();
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) {
    return IoError("the NVMe probe's directory " + dir + " cannot be created: " + ec.message() +
                   "; give a directory on a writable disk (--nvme-path, or strata.swap_paths)");
  }
  std::string path = dir + "/strata-lane-probe.tmp";
  STRATA_ASSIGN_OR_RETURN(int file, io->RegisterFile(path, /*create=*/true));
  // op kRead/kWrite: the whole file; mixed: reads and writes interleaved over it, the
  // first read_fraction of the blocks read and the rest written.
  auto pass = [&](IoOp op, bool mixed = false) -> Result<double> {
    auto t0 = std::chrono::steady_clock::now();
    std::vector<IoRequest> reqs;
    const uint64_t blocks = file_bytes / block;
    const uint64_t reads = static_cast<uint64_t>(std::clamp(read_fraction, 0.0, 1.0) * blocks);
    uint64_t next_read = 0, next_write = reads;
    for (uint64_t i = 0; i < blocks; ++i) {
      uint64_t off = i * block;
      if (mixed) {
        // Keep the two streams in proportion all through the pass.
        const bool read = next_write >= blocks || (next_read < reads && next_read * blocks <= i * reads);
        op = read ? IoOp::kRead : IoOp::kWrite;
        off = (read ? next_read++ : next_write++) * block;
      }
      IoRequest r;
      r.op = op;
      r.file = file;
      r.offset = off;
      r.length = block;
      r.buffer =
          static_cast<char*>(arena->base()) + (off / block % depth + (op == IoOp::kRead ? 0 : depth)) * block;
      reqs.push_back(r);
    }
    STRATA_ASSIGN_OR_RETURN(IoHandle h, io->Submit(reqs));
    STRATA_RETURN_IF_ERROR(h.Wait());
    return file_bytes / Since(t0);
  };
  // The first write fills fresh extents; measure overwrites and reads after it. The disk
  // of a shared machine has slow spells: the best of three passes each way is what it
  // can do, so the bound is not loosened by a spell during the probe.
  STRATA_RETURN_IF_ERROR(pass(IoOp::kWrite).status());
  rates->nvme_write_bytes_per_s = rates->nvme_read_bytes_per_s = 0;
  for (int i = 0; i < 3; ++i) {
    STRATA_ASSIGN_OR_RETURN(double w, pass(IoOp::kWrite));
    STRATA_ASSIGN_OR_RETURN(double r, pass(IoOp::kRead));
    rates->nvme_write_bytes_per_s = std::max(rates->nvme_write_bytes_per_s, w);
    rates->nvme_read_bytes_per_s = std::max(rates->nvme_read_bytes_per_s, r);
    STRATA_ASSIGN_OR_RETURN(double m, pass(IoOp::kRead, /*mixed=*/true));
    rates->nvme_mixed_bytes_per_s = std::max(rates->nvme_mixed_bytes_per_s, m);
  }
  STRATA_RETURN_IF_ERROR(io->UnregisterFile(file));
  std::filesystem::remove(path, ec);
  return OkStatus();
}

}  // namespace

LaneRates BestOf(const LaneRates& a, const LaneRates& b) {
  LaneRates r = a;
  r.adam_params_per_s = std::max(a.adam_params_per_s, b.adam_params_per_s);
  r.copy_bytes_per_s = std::max(a.copy_bytes_per_s, b.copy_bytes_per_s);
  r.nvme_read_bytes_per_s = std::max(a.nvme_read_bytes_per_s, b.nvme_read_bytes_per_s);
  r.nvme_write_bytes_per_s = std::max(a.nvme_write_bytes_per_s, b.nvme_write_bytes_per_s);
  r.nvme_mixed_bytes_per_s = std::max(a.nvme_mixed_bytes_per_s, b.nvme_mixed_bytes_per_s);
  return r;
}

Result<LaneRates> MeasureLaneRates(const std::string& nvme_dir, int64_t adam_params,
                                   uint64_t nvme_probe_bytes, double read_fraction) {
  LaneRates r;
  // Past the caches Adam's rate is per parameter, so a large shard is probed at 16M: the
  // probe holds its own p, m, v and g, which for a 2B shard would not fit beside the run.
  STRATA_ASSIGN_OR_RETURN(r.adam_params_per_s,
                          MeasureAdam(std::clamp<int64_t>(adam_params, 1 << 20, 16 << 20)));
  r.copy_bytes_per_s = MeasureCopy();
  if (!nvme_dir.empty()) STRATA_RETURN_IF_ERROR(MeasureNvme(nvme_dir, nvme_probe_bytes, read_fraction, &r));
  return r;
}

StepModel ModelStep(const LaneRates& rates, const LaneWork& w, bool shared_cpu) {
  StepModel m;
  auto rate = [](double work, double r) { return work > 0 && r > 0 ? work / r : 0.0; };
  double adam = rate(w.adam_params, rates.adam_params_per_s);
  double copy = rate(w.copy_bytes, rates.copy_bytes_per_s);
  // Host collectives on one machine move memory through the same cores.
  double comm = rate(w.comm_bytes, rates.copy_bytes_per_s);
  double rd = rate(w.nvme_read_bytes, rates.nvme_read_bytes_per_s);
  double wr = rate(w.nvme_write_bytes, rates.nvme_write_bytes_per_s);
  m.lanes = {{"compute", w.compute_s}, {"cpu_adam", adam}, {"copies", copy},
             {"collectives", comm},    {"nvme_read", rd},  {"nvme_write", wr}};
  m.nvme_s = rd + wr;  // one disk: reads and writes share it
  m.cpu_s = shared_cpu ? w.compute_s + adam + copy + comm : adam;
  // The slowest lane, with the disk taking `disk_s`.
  auto bound = [&](double disk_s) {
    return shared_cpu ? std::max(m.cpu_s, disk_s) : std::max({w.compute_s, adam, copy, comm, disk_s});
  };
  m.bound_s = bound(m.nvme_s);
  for (auto& [name, s] : m.lanes) m.serial_s += s;
  if (rates.nvme_mixed_bytes_per_s > 0) {
    m.nvme_mixed_s = rate(w.nvme_read_bytes + w.nvme_write_bytes, rates.nvme_mixed_bytes_per_s);
    m.bound_mixed_s = bound(m.nvme_mixed_s);
  }
  return m;
}

namespace {

nlohmann::json ToJson(const EngineRates& e) {
  return {{"optimizer_params_per_s", e.optimizer_params_per_s},
          {"other_s_per_param", e.other_s_per_param},
          {"overlap_factor", e.overlap_factor}};
}

}  // namespace

nlohmann::json RatesToJson(const LaneRates& r) {
  return {{"adam_params_per_s", r.adam_params_per_s},
          {"copy_bytes_per_s", r.copy_bytes_per_s},
          {"nvme_read_bytes_per_s", r.nvme_read_bytes_per_s},
          {"nvme_write_bytes_per_s", r.nvme_write_bytes_per_s},
          {"nvme_mixed_bytes_per_s", r.nvme_mixed_bytes_per_s},
          {"nvme_backend", r.nvme_backend},
          {"compute_flops_per_s", r.compute_flops_per_s},
          {"device_optimizer", ToJson(r.device_optimizer)},
          {"host_optimizer", ToJson(r.host_optimizer)},
          {"host_optimizer_stage3", ToJson(r.host_optimizer_stage3)},
          {"device_split", ToJson(r.device_split)},
          {"nvme_optimizer", ToJson(r.nvme_optimizer)},
          {"nvme_optimizer_master", ToJson(r.nvme_optimizer_master)}};
}

Result<LaneRates> RatesFromJson(const nlohmann::json& doc) {
  const nlohmann::json& top = doc.contains("rates") ? doc["rates"] : doc;
  if (!top.is_object()) return InvalidArgumentError("lane rates: expected a JSON object");
  LaneRates r;
  const nlohmann::json* at = &top;
  std::string in;  // "device_split." while reading that object: errors name the field in full
  auto read = [&](const char* key, double* out, bool required, bool any_sign = false) -> Status {
    const nlohmann::json& j = *at;
    if (!j.contains(key)) {
      return required ? InvalidArgumentError("lane rates: \"" + in + key + "\" is missing") : OkStatus();
    }
    if (!j[key].is_number() || (!any_sign && j[key].get<double>() < 0)) {
      return InvalidArgumentError("lane rates: \"" + in + key + "\" must be a number" +
                                  (any_sign ? "" : " >= 0"));
    }
    *out = j[key].get<double>();
    return OkStatus();
  };
  STRATA_RETURN_IF_ERROR(read("adam_params_per_s", &r.adam_params_per_s, true));
  STRATA_RETURN_IF_ERROR(read("copy_bytes_per_s", &r.copy_bytes_per_s, true));
  STRATA_RETURN_IF_ERROR(read("nvme_read_bytes_per_s", &r.nvme_read_bytes_per_s, false));
  STRATA_RETURN_IF_ERROR(read("nvme_write_bytes_per_s", &r.nvme_write_bytes_per_s, false));
  STRATA_RETURN_IF_ERROR(read("nvme_mixed_bytes_per_s", &r.nvme_mixed_bytes_per_s, false));
  STRATA_RETURN_IF_ERROR(read("compute_flops_per_s", &r.compute_flops_per_s, false));
  if (top.contains("nvme_backend") && top["nvme_backend"].is_string()) r.nvme_backend = top["nvme_backend"];
  // A variant a profile lacks (written before it was calibrated) takes the figures it
  // refines, listed before it.
  const struct {
    const char* key;
    EngineRates* rates;
    const EngineRates* otherwise;
  } engines[] = {{"device_optimizer", &r.device_optimizer, nullptr},
                 {"host_optimizer", &r.host_optimizer, nullptr},
                 {"host_optimizer_stage3", &r.host_optimizer_stage3, &r.host_optimizer},
                 {"device_split", &r.device_split, &r.device_optimizer},
                 {"nvme_optimizer", &r.nvme_optimizer, nullptr},
                 {"nvme_optimizer_master", &r.nvme_optimizer_master, &r.nvme_optimizer}};
  for (const auto& [key, e, otherwise] : engines) {
    if (!top.contains(key)) {
      if (otherwise != nullptr) *e = *otherwise;
      continue;
    }
    at = &top[key];
    in = std::string(key) + ".";
    if (!at->is_object())
      return InvalidArgumentError(std::string("lane rates: \"") + key + "\" must be an object");
    STRATA_RETURN_IF_ERROR(read("optimizer_params_per_s", &e->optimizer_params_per_s, true));
    STRATA_RETURN_IF_ERROR(read("other_s_per_param", &e->other_s_per_param, true, /*any_sign=*/true));
    STRATA_RETURN_IF_ERROR(read("overlap_factor", &e->overlap_factor, true));
  }
  return r;
}

nlohmann::json ToJson(const StepModel& m) {
  nlohmann::json lanes = nlohmann::json::object();
  for (auto& [name, s] : m.lanes) lanes[name] = s;
  return {{"lanes_s", lanes},
          {"cpu_s", m.cpu_s},
          {"nvme_s", m.nvme_s},
          {"bound_s", m.bound_s},
          {"serial_s", m.serial_s},
          {"nvme_mixed_s", m.nvme_mixed_s},
          {"bound_mixed_s", m.bound_mixed_s}};
}

}  // namespace strata::tools
