// TierManager: creation, registration of blocks, telemetry and descriptions.
#include <algorithm>
#include <cstring>
#include <set>

#include "strata/device.h"
#include "strata/log.h"
#include "strata/nvme_store.h"
#include "strata/units.h"
#include "tiering/tier_internal.h"

namespace strata {

using tiering::Block;
using tiering::Copy;

namespace {
constexpr uint64_t kAlign = 4096;
uint64_t RoundUp(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }
}  // namespace

Result<std::unique_ptr<TierManager>> TierManager::Create(TierManagerOptions options) {
  if (options.planes.empty()) return InvalidArgumentError("tier manager: no planes given");
  for (const PlaneSpec& p : options.planes) {
    if (p.element_bytes == 0) return InvalidArgumentError("tier manager: plane " + p.name + " has element size 0");
  }
  if (options.layout.num_chunks() == 0) return InvalidArgumentError("tier manager: empty chunk layout");
  if (options.budgets.device > 0) {
    if (options.device == nullptr) return InvalidArgumentError("tier manager: a device budget needs a Device");
    if (options.budgets.device > options.device->capacity())
      return InvalidArgumentError("tier manager: device budget " + FormatBytes(options.budgets.device) +
                                  " exceeds the device capacity " + FormatBytes(options.device->capacity()) +
                                  " (strata.device_budget)");
  }
  if (options.budgets.host > 0) {
    if (options.host_arena == nullptr) return InvalidArgumentError("tier manager: a host budget needs a HostArena");
    if (options.budgets.host > options.host_arena->size())
      return InvalidArgumentError("tier manager: host budget " + FormatBytes(options.budgets.host) +
                                  " exceeds the pinned arena of " + FormatBytes(options.host_arena->size()) +
                                  " (strata.host_budget)");
  }
  if (options.nvme_slots_per_block != 1 && options.nvme_slots_per_block != 2)
    return InvalidArgumentError("tier manager: nvme_slots_per_block must be 1 or 2");

  auto impl = std::make_unique<Impl>();
  Impl& m = *impl;
  if (options.budgets.nvme > 0 && options.nvme_backend == nullptr) {
    if (options.io_engine == nullptr || options.nvme_paths.empty())
      return InvalidArgumentError(
          "tier manager: an NVMe budget needs swap paths (strata.swap_paths) and an IoEngine");
    uint64_t slot = options.nvme_slot_bytes;
    if (slot == 0) {
      slot = UINT64_MAX;
      for (const PlaneSpec& p : options.planes) {
        slot = std::min(slot, options.layout.shard_elements() * p.element_bytes);
      }
    }
    slot = RoundUp(slot, kAlign);
    NvmeStoreOptions so;
    so.paths = options.nvme_paths;
    so.name = options.nvme_name;
    so.slot_size = slot;
    so.slot_count = options.budgets.nvme / slot;
    so.checksum = options.checksum;
    if (so.slot_count == 0)
      return InvalidArgumentError("tier manager: NVMe budget " + FormatBytes(options.budgets.nvme) +
                                  " is smaller than one slot of " + FormatBytes(slot));
    STRATA_ASSIGN_OR_RETURN(options.nvme_backend, tiering::OpenNvmeSlotBackend(*options.io_engine, so));
  }
  m.nvme = options.nvme_backend;
  if (options.budgets.nvme == 0 && m.nvme != nullptr) {
    options.budgets.nvme = m.nvme->slot_size() * m.nvme->free_slots();
  }
  if (options.budgets.device > 0) {
    STRATA_ASSIGN_OR_RETURN(m.h2d_stream, options.device->CreateStream("tier-h2d"));
    STRATA_ASSIGN_OR_RETURN(m.d2h_stream, options.device->CreateStream("tier-d2h"));
  }
  m.policy = options.policy == TierPolicy::kLru ? tiering::MakeLruPolicy() : tiering::MakeTracePolicy();
  if (options.timeline == nullptr) {
    m.own_timeline = std::make_unique<Timeline>(!options.trace_file.empty());
    m.timeline = m.own_timeline.get();
  } else {
    m.timeline = options.timeline;
  }
  for (int l = 0; l < kNumLanes; ++l) {
    std::string_view name = LaneName(static_cast<Lane>(l));
    m.tracks[static_cast<size_t>(l)] = m.timeline->AddTrack(name);
    m.lane_tele[static_cast<size_t>(l)].name = std::string(name);
  }
  m.options = std::move(options);
  m.lanes = std::make_unique<tiering::LaneSet>();
  return std::unique_ptr<TierManager>(new TierManager(std::move(impl)));
}

TierManager::TierManager(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

TierManager::~TierManager() {
  Impl& m = *impl_;
  {
    std::unique_lock<std::mutex> lock(m.mu);
    m.pending.clear();
    m.shutting_down = true;
    m.cv.wait(lock, [&] { return m.in_flight == 0; });
  }
  m.lanes.reset();
  if (!m.options.trace_file.empty()) {
    Status s = m.timeline->WriteChromeTrace(m.options.trace_file);
    if (!s.ok()) {
      STRATA_LOG(kWarn, "tier") << s.ToString();
    }
  }
  std::lock_guard<std::mutex> lock(m.mu);
  for (auto& [id, b] : m.blocks) {
    for (int t = 0; t < 2; ++t) m.FreeCopy(b, tiering::TierAt(t));
    for (auto& slots : b.nvme.slots) {
      for (uint32_t s : slots) m.nvme->FreeSlot(s).IgnoreError();  // the store goes away next
    }
  }
  for (auto& [size, list] : m.device_cache[0]) {
    for (void* p : list) m.options.device->Free(p);
  }
  for (auto& [size, list] : m.host_cache) {
    for (const HostBlock& hb : list) m.options.host_arena->Free(hb);
  }
}

tiering::Block* TierManager::Impl::Find(BlockId id) {
  auto it = blocks.find(id);
  return it == blocks.end() ? nullptr : &it->second;
}
const tiering::Block* TierManager::Impl::Find(BlockId id) const {
  auto it = blocks.find(id);
  return it == blocks.end() ? nullptr : &it->second;
}

const ChunkLayout& TierManager::layout() const { return impl_->options.layout; }
const TierManagerOptions& TierManager::options() const { return impl_->options; }

uint64_t TierManager::BlockBytes(BlockId block) const {
  const TierManagerOptions& o = impl_->options;
  if (block.plane >= o.planes.size()) return 0;
  uint64_t elements = block.shard == kWholeChunk ? o.layout.chunk_elements() : o.layout.shard_elements();
  return elements * o.planes[block.plane].element_bytes;
}

bool TierManager::IsRegistered(BlockId block) const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->Find(block) != nullptr;
}

Status TierManager::Register(BlockId block, Tier home, std::span<const std::byte> initial) {
  Impl& m = *impl_;
  const TierManagerOptions& o = m.options;
  std::string name = tiering::BlockName(o, block);
  if (block.plane >= o.planes.size())
    return InvalidArgumentError("register " + name + ": plane index out of range (" +
                                std::to_string(o.planes.size()) + " planes)");
  if (block.chunk >= o.layout.num_chunks())
    return InvalidArgumentError("register " + name + ": chunk out of range (" +
                                std::to_string(o.layout.num_chunks()) + " chunks)");
  if (block.shard != kWholeChunk && block.shard >= static_cast<uint32_t>(o.layout.world_size()))
    return InvalidArgumentError("register " + name + ": shard outside world size");
  if (o.budgets[home] == 0 && !(home == Tier::kNvme && m.nvme != nullptr))
    return InvalidArgumentError("register " + name + ": the " + std::string(TierName(home)) +
                                " tier has no budget");
  const uint64_t bytes = BlockBytes(block);
  if (!initial.empty() && initial.size() != bytes)
    return InvalidArgumentError("register " + name + ": initial contents are " + std::to_string(initial.size()) +
                                " bytes, the block is " + std::to_string(bytes));
  const uint64_t alloc = RoundUp(bytes, kAlign);
  {
    std::lock_guard<std::mutex> lock(m.mu);
    if (m.Find(block) != nullptr) return InvalidArgumentError("register " + name + ": already registered");
    Block b;
    b.id = block;
    b.bytes = bytes;
    b.alloc = alloc;
    b.home = home;
    if (home == Tier::kNvme) {
      uint64_t per = (alloc + m.nvme->slot_size() - 1) / m.nvme->slot_size();
      b.nvme.nslots = o.nvme_slots_per_block;
      for (int v = 0; v < b.nvme.nslots; ++v) {
        for (uint64_t i = 0; i < per; ++i) {
          Result<uint32_t> s = m.nvme->AllocateSlot();
          if (!s.ok()) {
            for (auto& list : b.nvme.slots) {
              for (uint32_t x : list) m.nvme->FreeSlot(x).IgnoreError();  // just allocated by us
            }
            return OutOfBudgetError("nvme tier: no room to register " + name + " (" + FormatBytes(alloc) + " x " +
                                    std::to_string(b.nvme.nslots) + " slots): budget " +
                                    FormatBytes(o.budgets.nvme) + ", reserved " + FormatBytes(m.used[2]) +
                                    "; raise strata.nvme_budget");
          }
          b.nvme.slots[static_cast<size_t>(v)].push_back(*s);
        }
      }
      m.used[2] += per * m.nvme->slot_size() * static_cast<uint64_t>(b.nvme.nslots);
      m.UpdateHighWater(Tier::kNvme);
      b.nvme.committed_version = initial.empty() ? 1 : 0;
      b.nvme.zero = initial.empty();
    }
    m.blocks.emplace(block, std::move(b));
    if (home == Tier::kNvme && initial.empty()) return OkStatus();
  }
  // Place the contents through a pinned acquisition of the home tier (host for NVMe).
  Tier place = home == Tier::kNvme ? Tier::kHost : home;
  Status s = [&]() -> Status {
    STRATA_ASSIGN_OR_RETURN(BlockHandle h, m.AcquireImpl(block, place, Access::kOverwrite, "register", false));
    STRATA_RETURN_IF_ERROR(h.Wait());
    if (place == Tier::kHost) {
      if (initial.empty()) {
        std::memset(h.data(), 0, alloc);
      } else {
        std::memcpy(h.data(), initial.data(), bytes);
        std::memset(static_cast<std::byte*>(h.data()) + bytes, 0, alloc - bytes);
      }
    } else {
      std::vector<std::byte> staging(alloc);
      if (!initial.empty()) std::memcpy(staging.data(), initial.data(), bytes);
      STRATA_RETURN_IF_ERROR(
          o.device->CopyAsync(m.h2d_stream, h.data(), staging.data(), alloc, CopyDir::kHostToDevice));
      STRATA_RETURN_IF_ERROR(o.device->Synchronize(m.h2d_stream));
    }
    h.Release();
    if (home == Tier::kNvme) STRATA_RETURN_IF_ERROR(Evict(block, Tier::kHost));
    return OkStatus();
  }();
  if (!s.ok()) {
    Unregister(block).IgnoreError();  // undoing a half-done registration; `s` is what matters
    return s.WithContext("registering " + name);
  }
  return OkStatus();
}

Status TierManager::RegisterPlane(uint32_t plane, Tier home, uint32_t shard) {
  for (uint32_t c = 0; c < impl_->options.layout.num_chunks(); ++c) {
    STRATA_RETURN_IF_ERROR(Register(BlockId{c, plane, shard}, home));
  }
  return OkStatus();
}

Status TierManager::Unregister(BlockId block) {
  Impl& m = *impl_;
  std::unique_lock<std::mutex> lock(m.mu);
  Block* b = m.Find(block);
  if (b == nullptr) return NotFoundError("unregister " + tiering::BlockName(m.options, block) + ": not registered");
  if (b->pins[0] + b->pins[1] > 0)
    return FailedPreconditionError("unregister " + tiering::BlockName(m.options, block) + ": still pinned");
  m.DropWant(*b, Tier::kDevice);
  m.DropWant(*b, Tier::kHost);
  m.WaitBlockIdle(lock, block);
  b = m.Find(block);
  if (b == nullptr) return OkStatus();
  for (int t = 0; t < 2; ++t) m.FreeCopy(*b, tiering::TierAt(t));
  uint64_t nslots = 0;
  for (auto& list : b->nvme.slots) {
    for (uint32_t s : list) {
      m.nvme->FreeSlot(s).IgnoreError();  // a slot we allocated; the store only refuses unknown ones
      nslots++;
    }
  }
  if (m.nvme != nullptr) m.used[2] -= nslots * m.nvme->slot_size();
  m.blocks.erase(block);
  m.cv.notify_all();
  return OkStatus();
}

TierTelemetry TierManager::Telemetry() const {
  const Impl& m = *impl_;
  std::lock_guard<std::mutex> lock(m.mu);
  TierTelemetry t = m.tele;
  for (int i = 0; i < kNumTiers; ++i) {
    t.budget[static_cast<size_t>(i)] = m.options.budgets[tiering::TierAt(i)];
  }
  t.used = m.used;
  t.high_water = m.high_water;
  t.lanes = m.lane_tele;
  t.trace_length = m.policy->trace_length();
  return t;
}

void TierManager::ResetTelemetry() {
  Impl& m = *impl_;
  std::lock_guard<std::mutex> lock(m.mu);
  m.tele = TierTelemetry{};
  m.high_water = m.used;
  for (LaneTelemetry& l : m.lane_tele) {
    l.moves = 0;
    l.bytes = 0;
    l.busy_s = 0;
  }
}

Timeline& TierManager::timeline() { return *impl_->timeline; }

Status TierManager::WriteTrace(const std::string& path) const { return impl_->timeline->WriteChromeTrace(path); }

std::vector<Tier> TierManager::ValidTiers(BlockId block) const {
  const Impl& m = *impl_;
  std::lock_guard<std::mutex> lock(m.mu);
  std::vector<Tier> out;
  const Block* b = m.Find(block);
  if (b == nullptr) return out;
  for (int t = 0; t < 2; ++t) {
    const Copy& c = b->copies[static_cast<size_t>(t)];
    if (c.state == Copy::State::kValid && c.version == b->version) out.push_back(tiering::TierAt(t));
  }
  if (m.NvmeValid(*b)) out.push_back(Tier::kNvme);
  return out;
}

std::string TierManager::DescribePinned(Tier tier) const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->DescribePinnedLocked(tier);
}

std::string TierManager::Impl::DescribePinnedLocked(Tier t) const {
  if (t == Tier::kNvme) return "none";
  size_t ti = static_cast<size_t>(tiering::TierIndex(t));
  std::vector<std::pair<BlockId, std::string>> rows;
  for (const auto& [id, b] : blocks) {
    if (b.pins[ti] == 0) continue;
    std::set<std::string> labels;
    for (const auto& tk : b.tickets) {
      if (tk->tier == t) labels.insert(tk->label.empty() ? "(unlabelled)" : tk->label);
    }
    std::string who;
    for (const std::string& l : labels) who += (who.empty() ? "" : ", ") + l;
    rows.emplace_back(id, tiering::BlockName(options, id) + " (" + FormatBytes(b.alloc) + ", by " + who + ")");
  }
  if (rows.empty()) return "none";
  std::sort(rows.begin(), rows.end());
  std::string out;
  size_t shown = 0;
  for (const auto& r : rows) {
    if (shown++ == 16) {
      out += "; and " + std::to_string(rows.size() - 16) + " more";
      break;
    }
    out += (out.empty() ? "" : "; ") + r.second;
  }
  return out;
}

Status TierManager::Impl::OutOfBudget(Tier t, uint64_t bytes, const Block& b) const {
  size_t ti = static_cast<size_t>(tiering::TierIndex(t));
  std::string knob = t == Tier::kDevice ? "strata.device_budget" : "strata.host_budget";
  return OutOfBudgetError(std::string(TierName(t)) + " tier: cannot make room for " +
                          tiering::BlockName(options, b.id) + " (" + FormatBytes(bytes) + "): budget " +
                          FormatBytes(options.budgets[t]) + ", in use " + FormatBytes(used[ti]) + ", " +
                          FormatBytes(Unevictable(t)) +
                          " of it cannot be evicted (pinned or at home). Pinned: " +
                          DescribePinnedLocked(t) + ". Release blocks before acquiring more, or raise " + knob);
}

}  // namespace strata
