// This machine as strata sees it: NUMA nodes, cores, caches, GPUs and their NUMA node,
// huge pages, the memlock limit, and the block device behind a path.
//
// Discovered with hwloc (the only file that includes hwloc.h is
// src/core/topology_hwloc.cc), or loaded from an hwloc XML file so that placement logic
// can be tested with any machine (tests/data/ holds a synthetic 2-NUMA-node one).
//
// GPUs are found as PCI devices (NVIDIA display/3D controllers) in hwloc's I/O tree, so
// they appear in XML topologies too and without CUDA; the device layer matches them to
// CUDA ordinals by PCI bus id (Device::pci_bus_id()).
//
// All values are plain data; the functions are thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "strata/status.h"

namespace strata {

struct NumaNode {
  int os_index = 0;           // the kernel's node number (numactl's)
  uint64_t memory_bytes = 0;  // local memory
  std::vector<int> cpus;      // OS indices of the PUs (hardware threads) of this node
  std::string cpuset;         // the same as a list, e.g. "0-15,32-47"
};

struct CacheLevel {
  int level = 0;            // 1, 2, 3
  std::string type;         // "data", "instruction", "unified"
  uint64_t size_bytes = 0;  // of one cache at this level
  int count = 0;            // how many of them
};

struct PciGpu {
  std::string pci_bus_id;  // "0000:17:00.0" (lower-case hex, as cudaDeviceGetPCIBusId)
  std::string name;        // hwloc's name where known ("" otherwise)
  uint16_t vendor_id = 0;
  uint16_t device_id = 0;
  int numa_node = -1;  // OS index of the nearest NUMA node; -1 when unknown
};

struct HugePages {
  uint64_t default_size_bytes = 0;  // Hugepagesize in /proc/meminfo (0: unknown)
  uint64_t total = 0;               // HugePages_Total (pages of the default size)
  uint64_t free = 0;                // HugePages_Free
  std::string thp_enabled;          // the selected transparent_hugepage mode: always|madvise|never|""
};

// RLIMIT_MEMLOCK (`ulimit -l`) and whether this process may ignore it (CAP_IPC_LOCK).
// mlock() and io_uring buffer registration count against it unless cap_ipc_lock.
struct MemlockLimit {
  bool unlimited = false;     // soft limit is RLIM_INFINITY
  uint64_t soft_bytes = 0;    // meaningful when !unlimited
  uint64_t hard_bytes = 0;    // UINT64_MAX when the hard limit is unlimited
  bool cap_ipc_lock = false;  // the effective capability set holds CAP_IPC_LOCK
  // The bytes this process may lock: UINT64_MAX when unlimited or cap_ipc_lock.
  uint64_t lockable_bytes() const;
};

struct Topology {
  std::string source;     // "hwloc" or the XML file's path
  std::string cpu_model;  // "" when hwloc does not know it
  int packages = 0;
  int cores = 0;  // physical cores
  int pus = 0;    // hardware threads
  uint64_t total_memory_bytes = 0;
  std::vector<NumaNode> numa_nodes;  // sorted by os_index; at least one
  std::vector<CacheLevel> caches;    // sorted by level, then type
  std::vector<PciGpu> gpus;          // sorted by pci_bus_id
  // Host facts that do not come from hwloc: filled by DiscoverTopology only (an XML
  // topology leaves them default, since they describe the machine that runs the test).
  HugePages huge_pages;
  MemlockLimit memlock;

  // OS index of the NUMA node nearest the GPU with this PCI bus id (case-insensitive,
  // with or without the "0000:" domain); -1 when the GPU or its locality is unknown.
  int GpuNumaNode(std::string_view pci_bus_id) const;
  // The node with this OS index, or nullptr.
  const NumaNode* FindNumaNode(int os_index) const;
};

// Discovers this machine (hwloc, with PCI I/O devices), plus huge pages and memlock.
Result<Topology> DiscoverTopology();
// Loads an hwloc XML file (lstopo --of xml); a missing file is NotFound, a malformed
// one InvalidArgument, both naming the path.
Result<Topology> LoadTopologyXml(const std::string& path);

// Reads /proc/meminfo and /sys/kernel/mm/transparent_hugepage/enabled.
HugePages QueryHugePages();
// getrlimit(RLIMIT_MEMLOCK) and CAP_IPC_LOCK from /proc/self/status.
MemlockLimit QueryMemlockLimit();

// NUMA memory binding (hwloc), for the pinned host arena and I/O buffers.
// Binds [addr, addr + bytes) to NUMA node `numa_node` (OS index); call it before the
// memory is touched. InvalidArgument for a node this machine does not have;
// Unavailable when the OS refuses (no NUMA support, seccomp), with errno's text.
Status BindMemoryToNumaNode(void* addr, uint64_t bytes, int numa_node);
// Sets the calling thread's memory policy to `numa_node` (numa_node >= 0) or back to
// the default (-1): for memory whose pages another library touches (cudaHostAlloc).
Status BindThreadMemoryToNumaNode(int numa_node);

// The block device that holds a path (a file or a directory, which must exist).
struct BlockDevice {
  std::string path;                 // the path asked about
  std::string fs_type;              // "ext4", "xfs", "overlay", "tmpfs" ... (from mountinfo)
  uint32_t major = 0, minor = 0;    // st_dev of the path
  bool has_device = false;          // false for tmpfs, overlay and other virtual file systems
  std::string name;                 // kernel name of the device: "nvme0n1p2", "vda", "dm-0"
  std::string disk;                 // the whole disk it belongs to: "nvme0n1", "vda"
  bool is_nvme = false;             // the disk is an NVMe namespace
  bool rotational = false;          // queue/rotational
  std::string model;                // device/model, trimmed ("" when absent)
  uint32_t logical_block_size = 0;  // queue/logical_block_size (O_DIRECT alignment)
  int numa_node = -1;               // device/numa_node where the kernel knows it
  // For device-mapper / md devices, the disks underneath (each described as above,
  // without further nesting); empty otherwise.
  std::vector<std::string> slaves;
};
// Looks the device up in sysfs (/sys/dev/block/MAJ:MIN). A missing path is NotFound.
// A path on a virtual file system is OK with has_device == false.
Result<BlockDevice> BlockDeviceForPath(const std::string& path);

}  // namespace strata
