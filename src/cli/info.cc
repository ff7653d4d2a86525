// `strata info`: this machine as strata sees it: topology, devices, io_uring, memory
// limits, and the block device behind the swap paths. A table, or JSON with --json.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/table.h"
#include "strata/device.h"
#include "strata/host_arena.h"
#include "strata/io.h"
#include "strata/topology.h"
#include "strata/units.h"

namespace strata::cli {
namespace {

using nlohmann::json;

struct InfoOptions {
  bool json = false;
  std::string topology_xml;
  std::vector<std::string> paths;
};

json LimitJson(uint64_t bytes) { return bytes == UINT64_MAX ? json(nullptr) : json(bytes); }

json TopologyJson(const Topology& t) {
  json j = {{"source", t.source}, {"cpu_model", t.cpu_model},  {"packages", t.packages},
            {"cores", t.cores},   {"hardware_threads", t.pus}, {"memory_bytes", t.total_memory_bytes}};
  for (const NumaNode& n : t.numa_nodes) {
    j["numa_nodes"].push_back(
        {{"os_index", n.os_index}, {"memory_bytes", n.memory_bytes}, {"cpus", n.cpuset}});
  }
  j["caches"] = json::array();
  for (const CacheLevel& c : t.caches) {
    j["caches"].push_back(
        {{"level", c.level}, {"type", c.type}, {"size_bytes", c.size_bytes}, {"count", c.count}});
  }
  j["pci_gpus"] = json::array();
  for (const PciGpu& g : t.gpus) {
    j["pci_gpus"].push_back({{"pci_bus_id", g.pci_bus_id}, {"name", g.name}, {"numa_node", g.numa_node}});
  }
  return j;
}

json DevicesJson(const Topology& t) {
  CudaProbe p = ProbeCuda();
  json cuda = {{"built_with_cuda", p.built_with_cuda}, {"available", p.available},
               {"device_count", p.device_count},       {"runtime_version", p.runtime_version},
               {"driver_version", p.driver_version},   {"reason", p.reason}};
  cuda["devices"] = json::array();
  for (int i = 0; i < p.device_count; ++i) {
    auto d = QueryCudaDevice(i);
    if (!d.ok()) {
      cuda["devices"].push_back({{"index", i}, {"error", d.status().ToString()}});
      continue;
    }
    cuda["devices"].push_back(
        {{"index", i},
         {"name", d->name},
         {"pci_bus_id", d->pci_bus_id},
         {"numa_node", t.GpuNumaNode(d->pci_bus_id)},
         {"total_memory_bytes", d->total_memory},
         {"free_memory_bytes", d->free_memory},
         {"compute_capability", std::to_string(d->compute_major) + "." + std::to_string(d->compute_minor)},
         {"copy_engines", d->async_engines}});
  }
  return {{"auto_picks", p.available ? "cuda" : "sim"},
          {"sim", {{"default_capacity_bytes", kDefaultSimCapacity}}},
          {"cuda", cuda}};
}

json MemoryJson(const Topology& t) {
  const MemlockLimit& m = t.memlock;
  return {{"memlock",
           {{"soft_bytes", m.unlimited ? json(nullptr) : json(m.soft_bytes)},
            {"hard_bytes", LimitJson(m.hard_bytes)},
            {"cap_ipc_lock", m.cap_ipc_lock},
            {"lockable_bytes", LimitJson(m.lockable_bytes())}}},
          {"huge_pages",
           {{"default_size_bytes", t.huge_pages.default_size_bytes},
            {"total", t.huge_pages.total},
            {"free", t.huge_pages.free},
            {"transparent", t.huge_pages.thp_enabled}}},
          {"default_host_arena_bytes", DefaultHostArenaBytes(0, t)}};
}

json IoUringJson() {
  IoUringProbe p = ProbeIoUring();
  return {{"usable", p.usable},
          {"reason", p.reason},
          {"kernel", p.kernel},
          {"features", p.features},
          {"sqpoll", p.sqpoll}};
}

json StorageJson(const std::vector<std::string>& paths) {
  json out = json::array();
  for (const std::string& path : paths) {
    auto b = BlockDeviceForPath(path);
    if (!b.ok()) {
      out.push_back({{"path", path}, {"error", b.status().ToString()}});
      continue;
    }
    out.push_back({{"path", path},
                   {"fs_type", b->fs_type},
                   {"has_device", b->has_device},
                   {"device", b->name},
                   {"disk", b->disk},
                   {"is_nvme", b->is_nvme},
                   {"rotational", b->rotational},
                   {"model", b->model},
                   {"logical_block_size", b->logical_block_size},
                   {"numa_node", b->numa_node},
                   {"slaves", b->slaves}});
  }
  return out;
}

void PrintSection(const std::string& title) { std::printf("\n%s\n", title.c_str()); }

void PrintText(const json& j) {
  const json& t = j["topology"];
  std::printf("strata: this machine\n");
  PrintSection("Topology (" + t["source"].get<std::string>() + ")");
  Table summary({"item", "value"});
  summary.AddRow(
      {"cpu", t["cpu_model"].get<std::string>().empty() ? "(unknown)" : t["cpu_model"].get<std::string>()});
  summary.AddRow({"packages / cores / threads", std::to_string(t["packages"].get<int>()) + " / " +
                                                    std::to_string(t["cores"].get<int>()) + " / " +
                                                    std::to_string(t["hardware_threads"].get<int>())});
  summary.AddRow({"memory", FormatBytes(t["memory_bytes"].get<uint64_t>())});
  for (const json& c : t["caches"]) {
    summary.AddRow(
        {"L" + std::to_string(c["level"].get<int>()) + " " + c["type"].get<std::string>() + " cache",
         std::to_string(c["count"].get<int>()) + " x " + FormatBytes(c["size_bytes"].get<uint64_t>())});
  }
  std::fputs(summary.Render().c_str(), stdout);

  Table numa({"NUMA node", "memory", "cpus"});
  for (const json& n : t["numa_nodes"]) {
    numa.AddRow({std::to_string(n["os_index"].get<int>()), FormatBytes(n["memory_bytes"].get<uint64_t>()),
                 n["cpus"].get<std::string>()});
  }
  std::printf("\n%s", numa.Render().c_str());
  if (!t["pci_gpus"].empty()) {
    Table gpus({"PCI GPU", "name", "NUMA node"});
    for (const json& g : t["pci_gpus"]) {
      int node = g["numa_node"].get<int>();
      gpus.AddRow({g["pci_bus_id"].get<std::string>(), g["name"].get<std::string>(),
                   node < 0 ? "unknown" : std::to_string(node)});
    }
    std::printf("\n%s", gpus.Render().c_str());
  }

  const json& d = j["devices"];
  const json& cuda = d["cuda"];
  PrintSection("Devices");
  Table dev({"device", "status"});
  dev.AddRow({"sim", "available (default capacity " +
                         FormatBytes(d["sim"]["default_capacity_bytes"].get<uint64_t>()) + ")"});
  if (cuda["available"].get<bool>()) {
    for (const json& g : cuda["devices"]) {
      if (g.contains("error")) {
        dev.AddRow({"cuda:" + std::to_string(g["index"].get<int>()), g["error"].get<std::string>()});
        continue;
      }
      int node = g["numa_node"].get<int>();
      dev.AddRow({"cuda:" + std::to_string(g["index"].get<int>()),
                  g["name"].get<std::string>() + ", sm_" + g["compute_capability"].get<std::string>() + ", " +
                      FormatBytes(g["free_memory_bytes"].get<uint64_t>()) + " free of " +
                      FormatBytes(g["total_memory_bytes"].get<uint64_t>()) + ", " +
                      std::to_string(g["copy_engines"].get<int>()) + " copy engines, PCI " +
                      g["pci_bus_id"].get<std::string>() + ", NUMA node " +
                      (node < 0 ? "unknown" : std::to_string(node))});
    }
  } else {
    dev.AddRow({"cuda", "unavailable: " + cuda["reason"].get<std::string>()});
  }
  if (cuda["built_with_cuda"].get<bool>()) {
    dev.AddRow({"cuda runtime / driver", std::to_string(cuda["runtime_version"].get<int>()) + " / " +
                                             (cuda["driver_version"].get<int>() == 0
                                                  ? std::string("none")
                                                  : std::to_string(cuda["driver_version"].get<int>()))});
  }
  dev.AddRow({"--device auto picks", d["auto_picks"].get<std::string>()});
  std::fputs(dev.Render().c_str(), stdout);

  const json& m = j["memory"];
  PrintSection("Pinned memory");
  Table mem({"item", "value"});
  const json& ml = m["memlock"];
  std::string memlock =
      ml["soft_bytes"].is_null() ? "unlimited" : FormatBytes(ml["soft_bytes"].get<uint64_t>());
  memlock += " (hard " +
             (ml["hard_bytes"].is_null() ? std::string("unlimited")
                                         : FormatBytes(ml["hard_bytes"].get<uint64_t>())) +
             ")";
  if (ml["cap_ipc_lock"].get<bool>()) memlock += "; CAP_IPC_LOCK held, so the limit does not apply";
  mem.AddRow({"memlock limit (ulimit -l)", memlock});
  mem.AddRow(
      {"default host arena", FormatBytes(m["default_host_arena_bytes"].get<uint64_t>()) +
                                 " (half the memory, within the memlock limit; strata.host_budget sets it)"});
  const json& hp = m["huge_pages"];
  mem.AddRow({"huge pages", std::to_string(hp["free"].get<uint64_t>()) + " free of " +
                                std::to_string(hp["total"].get<uint64_t>()) + " x " +
                                FormatBytes(hp["default_size_bytes"].get<uint64_t>())});
  mem.AddRow({"transparent huge pages", hp["transparent"].get<std::string>().empty()
                                            ? "(unknown)"
                                            : hp["transparent"].get<std::string>()});
  std::fputs(mem.Render().c_str(), stdout);

  const json& io = j["io_uring"];
  PrintSection("io_uring");
  Table iot({"item", "value"});
  iot.AddRow({"kernel", io["kernel"].get<std::string>()});
  if (io["usable"].get<bool>()) {
    std::string features;
    for (const json& f : io["features"]) features += (features.empty() ? "" : ", ") + f.get<std::string>();
    iot.AddRow({"status", "usable"});
    iot.AddRow({"features", features});
    iot.AddRow({"sqpoll", io["sqpoll"].get<bool>() ? "yes" : "no"});
  } else {
    iot.AddRow({"status",
                "refused: " + io["reason"].get<std::string>() + " (the psync thread pool serves instead)"});
  }
  std::fputs(iot.Render().c_str(), stdout);

  PrintSection("Storage behind the swap paths");
  Table st({"path", "fs", "device", "NVMe", "rotational", "block", "model"});
  for (const json& s : j["storage"]) {
    if (s.contains("error")) {
      st.AddRow({s["path"].get<std::string>(), s["error"].get<std::string>()});
      continue;
    }
    bool has = s["has_device"].get<bool>();
    std::string devname = has ? s["device"].get<std::string>() : "(none: virtual file system)";
    if (has && !s["slaves"].empty()) {
      devname += " on";
      for (const json& sl : s["slaves"]) devname += " " + sl.get<std::string>();
    }
    st.AddRow({s["path"].get<std::string>(), s["fs_type"].get<std::string>(), devname,
               has ? (s["is_nvme"].get<bool>() ? "yes" : "no") : "-",
               has ? (s["rotational"].get<bool>() ? "yes" : "no") : "-",
               has ? std::to_string(s["logical_block_size"].get<uint32_t>()) : "-",
               s["model"].get<std::string>()});
  }
  std::fputs(st.Render().c_str(), stdout);
}

void RunInfo(const InfoOptions& o) {
  Result<Topology> topo = o.topology_xml.empty() ? DiscoverTopology() : LoadTopologyXml(o.topology_xml);
  ThrowIfError(topo.status());
  if (!o.topology_xml.empty()) {
    // Limits describe the process, not the (possibly foreign) machine in the file.
    topo->huge_pages = QueryHugePages();
    topo->memlock = QueryMemlockLimit();
  }
  std::vector<std::string> paths = o.paths;
  if (paths.empty()) {
    std::error_code ec;
    paths.push_back(std::filesystem::current_path(ec).string());
  }
  json j = {{"topology", TopologyJson(*topo)},
            {"devices", DevicesJson(*topo)},
            {"memory", MemoryJson(*topo)},
            {"io_uring", IoUringJson()},
            {"storage", StorageJson(paths)}};
  if (o.json) {
    std::cout << j.dump(2) << "\n";
  } else {
    PrintText(j);
  }
}

}  // namespace

void AddInfoCommand(CLI::App& app) {
  auto opts = std::make_shared<InfoOptions>();
  auto* cmd =
      app.add_subcommand("info", "show topology, devices, io_uring, memory limits and swap-path storage");
  cmd->add_flag("--json", opts->json, "print JSON instead of tables");
  cmd->add_option(
      "--path", opts->paths,
      "a swap path to describe (the block device behind it, NVMe or not); repeatable; default: the current "
      "directory");
  cmd->add_option("--topology-xml", opts->topology_xml,
                  "describe the machine in an hwloc XML file instead (lstopo --of xml)");
  cmd->callback([opts] { RunInfo(*opts); });
}

}  // namespace strata::cli
