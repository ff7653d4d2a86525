// Host facts outside hwloc: huge pages, the memlock limit, and the block device
// behind a path (sysfs), plus the Topology look-ups.
#include "strata/topology.h"

#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace strata {
namespace {

namespace fs = std::filesystem;

std::string Trim(std::string s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.pop_back();
  size_t i = 0;
  while (i < s.size() && std::isspace(static_cast<unsigned char>(s[i]))) ++i;
  return s.substr(i);
}

// The first line of a small sysfs/proc file, trimmed; "" when it cannot be read.
std::string ReadLine(const fs::path& p) {
  std::ifstream in(p);
  std::string line;
  if (!in || !std::getline(in, line)) return "";
  return Trim(line);
}

// Lower-case bus id with the 4-digit domain: "17:00.0" -> "0000:17:00.0".
std::string NormalizeBusId(std::string_view id) {
  std::string s(id);
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  if (std::count(s.begin(), s.end(), ':') == 1) s = "0000:" + s;
  // cudaDeviceGetPCIBusId gives an 8-digit domain ("00000000:17:00.0").
  size_t colon = s.find(':');
  if (colon != std::string::npos && colon > 4) s = s.substr(colon - 4);
  return s;
}

// Walks up from a sysfs device directory to the first one with a numa_node file.
int SysfsNumaNode(fs::path dir) {
  std::error_code ec;
  for (int depth = 0; depth < 12 && !dir.empty() && dir != dir.root_path();
       ++depth, dir = dir.parent_path()) {
    fs::path f = dir / "numa_node";
    if (fs::exists(f, ec)) {
      std::string v = ReadLine(f);
      return v.empty() ? -1 : std::atoi(v.c_str());
    }
  }
  return -1;
}

}  // namespace

uint64_t MemlockLimit::lockable_bytes() const {
  if (unlimited || cap_ipc_lock) return UINT64_MAX;
  return soft_bytes;
}

int Topology::GpuNumaNode(std::string_view pci_bus_id) const {
  std::string want = NormalizeBusId(pci_bus_id);
  for (const PciGpu& g : gpus) {
    if (NormalizeBusId(g.pci_bus_id) == want) return g.numa_node;
  }
  return -1;
}

const NumaNode* Topology::FindNumaNode(int os_index) const {
  for (const NumaNode& n : numa_nodes) {
    if (n.os_index == os_index) return &n;
  }
  return nullptr;
}

HugePages QueryHugePages() {
  HugePages h;
  std::ifstream in("/proc/meminfo");
  std::string key;
  uint64_t value = 0;
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream ls(line);
    if (!(ls >> key >> value)) continue;
    if (key == "HugePages_Total:") h.total = value;
    if (key == "HugePages_Free:") h.free = value;
    if (key == "Hugepagesize:") h.default_size_bytes = value * 1024;  // kB
  }
  // "always [madvise] never": the bracketed word is the mode in force.
  std::string thp = ReadLine("/sys/kernel/mm/transparent_hugepage/enabled");
  size_t open = thp.find('['), close = thp.find(']');
  if (open != std::string::npos && close != std::string::npos && close > open) {
    h.thp_enabled = thp.substr(open + 1, close - open - 1);
  }
  return h;
}

MemlockLimit QueryMemlockLimit() {
  MemlockLimit m;
  struct rlimit rl;
  if (getrlimit(RLIMIT_MEMLOCK, &rl) == 0) {
    m.unlimited = rl.rlim_cur == RLIM_INFINITY;
    m.soft_bytes = m.unlimited ? UINT64_MAX : static_cast<uint64_t>(rl.rlim_cur);
    m.hard_bytes = rl.rlim_max == RLIM_INFINITY ? UINT64_MAX : static_cast<uint64_t>(rl.rlim_max);
  }
  // CapEff is a hex mask; CAP_IPC_LOCK is capability 14.
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("CapEff:", 0) == 0) {
      uint64_t mask = std::strtoull(line.c_str() + 7, nullptr, 16);
      m.cap_ipc_lock = (mask >> 14) & 1;
    }
  }
  return m;
}

Result<BlockDevice> BlockDeviceForPath(const std::string& path) {
  BlockDevice b;
  b.path = path;
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) {
    int err = errno;
    if (err == ENOENT)
      return NotFoundError("path " + path + " does not exist (create it, or pass another --path)");
    return ErrnoError(err, "stat " + path);
  }
  b.major = major(st.st_dev);
  b.minor = minor(st.st_dev);

  // mountinfo: "id parent MAJ:MIN root mountpoint opts [tags...] - fstype source superopts".
  std::string devno = std::to_string(b.major) + ":" + std::to_string(b.minor);
  std::string source;
  {
    std::ifstream in("/proc/self/mountinfo");
    std::string line;
    while (std::getline(in, line)) {
      std::istringstream ls(line);
      std::string id, parent, mm;
      ls >> id >> parent >> mm;
      if (mm != devno) continue;
      size_t dash = line.find(" - ");
      if (dash == std::string::npos) continue;
      std::istringstream rest(line.substr(dash + 3));
      rest >> b.fs_type >> source;
      break;
    }
  }

  uint32_t maj = b.major, min = b.minor;
  if (maj == 0 && source.rfind("/dev/", 0) == 0) {
    // btrfs and some others report an anonymous st_dev; the mount source names the device.
    struct stat sst;
    if (::stat(source.c_str(), &sst) == 0 && S_ISBLK(sst.st_mode)) {
      maj = major(sst.st_rdev);
      min = minor(sst.st_rdev);
    }
  }
  if (maj == 0) return b;  // tmpfs, overlay, proc ...: no block device

  std::error_code ec;
  fs::path link = "/sys/dev/block/" + std::to_string(maj) + ":" + std::to_string(min);
  fs::path dev = fs::canonical(link, ec);
  if (ec) return b;  // not a block device the kernel lists (e.g. a network file system)
  b.has_device = true;
  b.name = dev.filename().string();
  fs::path disk_dir = fs::exists(dev / "partition", ec) ? dev.parent_path() : dev;
  b.disk = disk_dir.filename().string();
  b.rotational = ReadLine(disk_dir / "queue" / "rotational") == "1";
  b.model = ReadLine(disk_dir / "device" / "model");
  std::string lbs = ReadLine(disk_dir / "queue" / "logical_block_size");
  b.logical_block_size = lbs.empty() ? 0 : static_cast<uint32_t>(std::strtoul(lbs.c_str(), nullptr, 10));
  b.numa_node = SysfsNumaNode(disk_dir / "device");
  b.is_nvme = b.disk.rfind("nvme", 0) == 0;

  // device-mapper / md: NVMe when every device underneath is.
  fs::path slaves = disk_dir / "slaves";
  if (fs::is_directory(slaves, ec)) {
    for (const auto& e : fs::directory_iterator(slaves, ec)) b.slaves.push_back(e.path().filename().string());
    std::sort(b.slaves.begin(), b.slaves.end());
    if (!b.slaves.empty()) {
      b.is_nvme = std::all_of(b.slaves.begin(), b.slaves.end(),
                              [](const std::string& s) { return s.rfind("nvme", 0) == 0; });
    }
  }
  return b;
}

}  // namespace strata
