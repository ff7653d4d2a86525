// Topology from hwloc: the only file that includes hwloc.h.
#include <hwloc.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>

#include "strata/topology.h"

namespace strata {
namespace {

struct TopologyDeleter {
  void operator()(hwloc_topology_t t) const { hwloc_topology_destroy(t); }
};
using TopologyPtr = std::unique_ptr<hwloc_topology, TopologyDeleter>;

std::string BitmapList(hwloc_const_bitmap_t set) {
  char* text = nullptr;
  if (hwloc_bitmap_list_asprintf(&text, set) < 0 || text == nullptr) return "";
  std::string out(text);
  std::free(text);
  return out;
}

std::vector<int> BitmapIndices(hwloc_const_bitmap_t set) {
  std::vector<int> out;
  for (int i = hwloc_bitmap_first(set); i >= 0; i = hwloc_bitmap_next(set, i)) out.push_back(i);
  return out;
}

std::string Info(hwloc_obj_t obj, const char* name) {
  const char* v = hwloc_obj_get_info_by_name(obj, name);
  return v ? std::string(v) : std::string();
}

const char* CacheTypeName(hwloc_obj_cache_type_e t) {
  switch (t) {
    case HWLOC_OBJ_CACHE_DATA: return "data";
    case HWLOC_OBJ_CACHE_INSTRUCTION: return "instruction";
    default: return "unified";
  }
}

// NVIDIA display (0x0300) or 3D (0x0302) controllers.
bool IsNvidiaGpu(hwloc_obj_t pci) {
  unsigned cls = pci->attr->pcidev.class_id;
  return pci->attr->pcidev.vendor_id == 0x10de && (cls == 0x0300 || cls == 0x0302);
}

// The NUMA node nearest an I/O object: its first non-I/O ancestor's single node.
int NearestNumaNode(hwloc_topology_t topo, hwloc_obj_t io) {
  hwloc_obj_t anc = hwloc_get_non_io_ancestor_obj(topo, io);
  if (anc == nullptr || anc->nodeset == nullptr) return -1;
  if (hwloc_bitmap_weight(anc->nodeset) != 1) return -1;  // attached above several nodes
  return hwloc_bitmap_first(anc->nodeset);
}

Result<Topology> Extract(hwloc_topology_t topo, std::string source) {
  Topology t;
  t.source = std::move(source);
  t.packages = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_PACKAGE);
  t.cores = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_CORE);
  t.pus = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_PU);
  hwloc_obj_t root = hwloc_get_root_obj(topo);
  t.total_memory_bytes = root->total_memory;

  if (hwloc_obj_t pkg = hwloc_get_obj_by_type(topo, HWLOC_OBJ_PACKAGE, 0))
    t.cpu_model = Info(pkg, "CPUModel");
  if (t.cpu_model.empty()) t.cpu_model = Info(root, "CPUModel");

  int nodes = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_NUMANODE);
  for (int i = 0; i < nodes; ++i) {
    hwloc_obj_t n = hwloc_get_obj_by_type(topo, HWLOC_OBJ_NUMANODE, i);
    NumaNode node;
    node.os_index = static_cast<int>(n->os_index);
    node.memory_bytes = n->attr->numanode.local_memory;
    node.cpus = BitmapIndices(n->cpuset);
    node.cpuset = BitmapList(n->cpuset);
    t.numa_nodes.push_back(std::move(node));
  }
  std::sort(t.numa_nodes.begin(), t.numa_nodes.end(),
            [](const NumaNode& a, const NumaNode& b) { return a.os_index < b.os_index; });
  if (t.numa_nodes.empty()) return InternalError("hwloc topology (" + t.source + ") has no NUMA node");

  // One entry per (level, type): hwloc's cache objects of a level share a size in
  // practice; the first one found is reported with the count of all.
  std::map<std::pair<int, std::string>, CacheLevel> caches;
  for (hwloc_obj_type_t type :
       {HWLOC_OBJ_L1CACHE, HWLOC_OBJ_L1ICACHE, HWLOC_OBJ_L2CACHE, HWLOC_OBJ_L2ICACHE, HWLOC_OBJ_L3CACHE,
        HWLOC_OBJ_L3ICACHE, HWLOC_OBJ_L4CACHE, HWLOC_OBJ_L5CACHE}) {
    int n = hwloc_get_nbobjs_by_type(topo, type);
    for (int i = 0; i < n; ++i) {
      hwloc_obj_t c = hwloc_get_obj_by_type(topo, type, i);
      auto key = std::make_pair(static_cast<int>(c->attr->cache.depth),
                                std::string(CacheTypeName(c->attr->cache.type)));
      auto [it, inserted] = caches.try_emplace(key);
      if (inserted) {
        it->second.level = key.first;
        it->second.type = key.second;
        it->second.size_bytes = c->attr->cache.size;
      }
      ++it->second.count;
    }
  }
  for (auto& [key, level] : caches) t.caches.push_back(level);

  for (hwloc_obj_t pci = hwloc_get_next_pcidev(topo, nullptr); pci != nullptr;
       pci = hwloc_get_next_pcidev(topo, pci)) {
    if (!IsNvidiaGpu(pci)) continue;
    PciGpu gpu;
    char bus[32];
    std::snprintf(bus, sizeof bus, "%04x:%02x:%02x.%01x", pci->attr->pcidev.domain, pci->attr->pcidev.bus,
                  pci->attr->pcidev.dev, pci->attr->pcidev.func);
    gpu.pci_bus_id = bus;
    gpu.name = Info(pci, "PCIDevice");
    gpu.vendor_id = pci->attr->pcidev.vendor_id;
    gpu.device_id = pci->attr->pcidev.device_id;
    gpu.numa_node = NearestNumaNode(topo, pci);
    t.gpus.push_back(std::move(gpu));
  }
  std::sort(t.gpus.begin(), t.gpus.end(),
            [](const PciGpu& a, const PciGpu& b) { return a.pci_bus_id < b.pci_bus_id; });
  return t;
}

Result<TopologyPtr> NewTopology() {
  hwloc_topology_t raw = nullptr;
  if (hwloc_topology_init(&raw) != 0) return ErrnoError(errno, "hwloc_topology_init");
  TopologyPtr topo(raw);
  // PCI devices (GPUs, NVMe controllers) are I/O objects, filtered out by default.
  hwloc_topology_set_io_types_filter(raw, HWLOC_TYPE_FILTER_KEEP_IMPORTANT);
  return topo;
}

}  // namespace

Result<Topology> DiscoverTopology() {
  STRATA_ASSIGN_OR_RETURN(TopologyPtr topo, NewTopology());
  if (hwloc_topology_load(topo.get()) != 0)
    return ErrnoError(errno, "hwloc_topology_load (discovering this machine)");
  STRATA_ASSIGN_OR_RETURN(Topology t, Extract(topo.get(), "hwloc"));
  t.huge_pages = QueryHugePages();
  t.memlock = QueryMemlockLimit();
  return t;
}

Result<Topology> LoadTopologyXml(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) {
    return NotFoundError("topology XML file " + path + " does not exist (write one with `lstopo --of xml`)");
  }
  STRATA_ASSIGN_OR_RETURN(TopologyPtr topo, NewTopology());
  if (hwloc_topology_set_xml(topo.get(), path.c_str()) != 0) {
    return InvalidArgumentError("topology XML file " + path +
                                " could not be read by hwloc (not an hwloc XML export?)");
  }
  if (hwloc_topology_load(topo.get()) != 0) {
    return InvalidArgumentError("topology XML file " + path + " could not be loaded by hwloc (malformed?)");
  }
  return Extract(topo.get(), path);
}

namespace {

// A process-wide topology without I/O objects, loaded once, for binding calls.
Result<hwloc_topology_t> BindingTopology() {
  static TopologyPtr topo;
  static Status status;
  static std::once_flag once;
  std::call_once(once, [] {
    hwloc_topology_t raw = nullptr;
    if (hwloc_topology_init(&raw) != 0) {
      status = ErrnoError(errno, "hwloc_topology_init");
      return;
    }
    topo.reset(raw);
    if (hwloc_topology_load(raw) != 0) status = ErrnoError(errno, "hwloc_topology_load");
  });
  if (!status.ok()) return status;
  return topo.get();
}

struct BitmapDeleter {
  void operator()(hwloc_bitmap_t b) const { hwloc_bitmap_free(b); }
};

Result<std::unique_ptr<hwloc_bitmap_s, BitmapDeleter>> NodeSet(hwloc_topology_t topo, int numa_node) {
  hwloc_obj_t node = nullptr;
  while ((node = hwloc_get_next_obj_by_type(topo, HWLOC_OBJ_NUMANODE, node)) != nullptr) {
    if (static_cast<int>(node->os_index) == numa_node) break;
  }
  if (node == nullptr) {
    return InvalidArgumentError(
        "NUMA node " + std::to_string(numa_node) + " does not exist on this machine (" +
        std::to_string(hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_NUMANODE)) + " nodes; see `strata info`)");
  }
  std::unique_ptr<hwloc_bitmap_s, BitmapDeleter> set(hwloc_bitmap_dup(node->nodeset));
  return set;
}

}  // namespace

Status BindMemoryToNumaNode(void* addr, uint64_t bytes, int numa_node) {
  STRATA_ASSIGN_OR_RETURN(hwloc_topology_t topo, BindingTopology());
  STRATA_ASSIGN_OR_RETURN(auto set, NodeSet(topo, numa_node));
  if (hwloc_set_area_membind(topo, addr, bytes, set.get(), HWLOC_MEMBIND_BIND, HWLOC_MEMBIND_BYNODESET) !=
      0) {
    Status s = ErrnoError(errno, "binding memory to NUMA node " + std::to_string(numa_node));
    return UnavailableError(s.message());
  }
  return OkStatus();
}

Status BindThreadMemoryToNumaNode(int numa_node) {
  STRATA_ASSIGN_OR_RETURN(hwloc_topology_t topo, BindingTopology());
  int rc;
  if (numa_node < 0) {
    hwloc_const_nodeset_t all = hwloc_topology_get_topology_nodeset(topo);
    rc = hwloc_set_membind(topo, all, HWLOC_MEMBIND_DEFAULT, HWLOC_MEMBIND_THREAD | HWLOC_MEMBIND_BYNODESET);
  } else {
    STRATA_ASSIGN_OR_RETURN(auto set, NodeSet(topo, numa_node));
    rc = hwloc_set_membind(topo, set.get(), HWLOC_MEMBIND_BIND,
                           HWLOC_MEMBIND_THREAD | HWLOC_MEMBIND_BYNODESET);
  }
  if (rc != 0) {
    Status s =
        ErrnoError(errno, "setting the thread's memory policy to NUMA node " + std::to_string(numa_node));
    return UnavailableError(s.message());
  }
  return OkStatus();
}

}  // namespace strata
