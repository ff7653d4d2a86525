// Topology from a synthetic 2-NUMA-node hwloc XML file, and from this machine.
#include "strata/topology.h"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>

namespace strata {
namespace {

const std::string kXml = std::string(STRATA_TEST_DATA_DIR) + "/synthetic-2numa.xml";

TEST(Topology, LoadsTwoNumaNodesFromXml) {
  auto t = LoadTopologyXml(kXml);
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_EQ(t->source, kXml);
  EXPECT_EQ(t->packages, 2);
  EXPECT_EQ(t->cores, 8);
  EXPECT_EQ(t->pus, 16);
  ASSERT_EQ(t->numa_nodes.size(), 2u);
  EXPECT_EQ(t->numa_nodes[0].os_index, 0);
  EXPECT_EQ(t->numa_nodes[1].os_index, 1);
  EXPECT_EQ(t->numa_nodes[0].memory_bytes, 64ull << 30);
  EXPECT_EQ(t->numa_nodes[1].memory_bytes, 64ull << 30);
  EXPECT_EQ(t->total_memory_bytes, 128ull << 30);
  EXPECT_EQ(t->numa_nodes[0].cpuset, "0-7");
  EXPECT_EQ(t->numa_nodes[1].cpuset, "8-15");
  ASSERT_EQ(t->numa_nodes[1].cpus.size(), 8u);
  EXPECT_EQ(t->numa_nodes[1].cpus.front(), 8);
  EXPECT_EQ(t->numa_nodes[1].cpus.back(), 15);
  ASSERT_NE(t->FindNumaNode(1), nullptr);
  EXPECT_EQ(t->FindNumaNode(2), nullptr);
}

TEST(Topology, ReportsCacheLevels) {
  auto t = LoadTopologyXml(kXml);
  ASSERT_TRUE(t.ok());
  ASSERT_EQ(t->caches.size(), 3u);
  EXPECT_EQ(t->caches[0].level, 1);
  EXPECT_EQ(t->caches[0].type, "data");
  EXPECT_EQ(t->caches[0].size_bytes, 48u << 10);
  EXPECT_EQ(t->caches[0].count, 8);
  EXPECT_EQ(t->caches[1].level, 2);
  EXPECT_EQ(t->caches[1].size_bytes, 1u << 20);
  EXPECT_EQ(t->caches[2].level, 3);
  EXPECT_EQ(t->caches[2].size_bytes, 32u << 20);
  EXPECT_EQ(t->caches[2].count, 2);
}

TEST(Topology, FindsGpusAndTheirNumaNodes) {
  auto t = LoadTopologyXml(kXml);
  ASSERT_TRUE(t.ok());
  // Two H200s, one per package; the NVMe controller is not a GPU.
  ASSERT_EQ(t->gpus.size(), 2u);
  EXPECT_EQ(t->gpus[0].pci_bus_id, "0000:17:00.0");
  EXPECT_EQ(t->gpus[0].numa_node, 0);
  EXPECT_EQ(t->gpus[0].vendor_id, 0x10de);
  EXPECT_EQ(t->gpus[0].device_id, 0x2335);
  EXPECT_NE(t->gpus[0].name.find("H200"), std::string::npos);
  EXPECT_EQ(t->gpus[1].pci_bus_id, "0000:9a:00.0");
  EXPECT_EQ(t->gpus[1].numa_node, 1);
  // Bus ids as CUDA spells them (8-digit domain, upper case) and without a domain.
  EXPECT_EQ(t->GpuNumaNode("00000000:9A:00.0"), 1);
  EXPECT_EQ(t->GpuNumaNode("17:00.0"), 0);
  EXPECT_EQ(t->GpuNumaNode("0000:c1:00.0"), -1);  // the NVMe controller
  EXPECT_EQ(t->GpuNumaNode("0000:01:00.0"), -1);
}

TEST(Topology, XmlErrorsNameThePath) {
  auto missing = LoadTopologyXml("/nonexistent/topo.xml");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("/nonexistent/topo.xml"), std::string::npos);

  char path[] = "/tmp/strata-topo-XXXXXX";
  int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(write(fd, "<topology><oops", 15), 15);
  close(fd);
  auto bad = LoadTopologyXml(path);
  unlink(path);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find(path), std::string::npos);
}

TEST(Topology, DiscoversThisMachine) {
  auto t = DiscoverTopology();
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_EQ(t->source, "hwloc");
  EXPECT_GE(t->numa_nodes.size(), 1u);
  EXPECT_GE(t->cores, 1);
  EXPECT_GE(t->pus, t->cores);
  EXPECT_EQ(t->pus, static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN)));
  EXPECT_GT(t->total_memory_bytes, 0u);
  EXPECT_EQ(t->huge_pages.default_size_bytes % 4096, 0u);
  MemlockLimit m = QueryMemlockLimit();
  EXPECT_EQ(t->memlock.unlimited, m.unlimited);
  EXPECT_EQ(t->memlock.soft_bytes, m.soft_bytes);
}

TEST(Topology, MemlockLockableBytes) {
  MemlockLimit m;
  m.soft_bytes = 8 << 20;
  EXPECT_EQ(m.lockable_bytes(), 8u << 20);
  m.cap_ipc_lock = true;
  EXPECT_EQ(m.lockable_bytes(), UINT64_MAX);
  m.cap_ipc_lock = false;
  m.unlimited = true;
  EXPECT_EQ(m.lockable_bytes(), UINT64_MAX);
}

TEST(Topology, BlockDeviceBehindAPath) {
  auto b = BlockDeviceForPath(STRATA_TEST_DATA_DIR);
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_FALSE(b->fs_type.empty());
  if (b->has_device) {
    EXPECT_FALSE(b->name.empty());
    EXPECT_FALSE(b->disk.empty());
    EXPECT_GT(b->logical_block_size, 0u);
    EXPECT_EQ(b->is_nvme, b->disk.rfind("nvme", 0) == 0 || !b->slaves.empty());
  }
  auto proc = BlockDeviceForPath("/proc");
  ASSERT_TRUE(proc.ok());
  EXPECT_FALSE(proc->has_device);
  EXPECT_EQ(proc->fs_type, "proc");
  auto missing = BlockDeviceForPath("/nonexistent/swap");
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
}

TEST(Topology, BindsMemoryToAnExistingNode) {
  const size_t len = 1 << 20;
  void* p = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(p, MAP_FAILED);
  auto t = DiscoverTopology();
  ASSERT_TRUE(t.ok());
  Status s = BindMemoryToNumaNode(p, len, t->numa_nodes[0].os_index);
  EXPECT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(BindMemoryToNumaNode(p, len, 9999).code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(BindThreadMemoryToNumaNode(t->numa_nodes[0].os_index).ok());
  EXPECT_TRUE(BindThreadMemoryToNumaNode(-1).ok());
  munmap(p, len);
}

}  // namespace
}  // namespace strata
