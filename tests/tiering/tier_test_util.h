// Shared helpers for the tier manager tests: an in-memory NVMe slot backend with fault
// injection, and a fixture that builds a sim device, a small pinned arena and a manager.
#pragma once

#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <vector>

#include "strata/device.h"
#include "strata/host_arena.h"
#include "strata/tier.h"

namespace strata::testing {

// Threads pass it freely while it is open and wait at it while it is closed (race
// tests hold a move in flight with one).
class Gate {
 public:
  void Close() {
    std::lock_guard<std::mutex> lock(mu_);
    closed_ = true;
  }
  void Open() {
    std::lock_guard<std::mutex> lock(mu_);
    closed_ = false;
    cv_.notify_all();
  }
  void Pass() {
    std::unique_lock<std::mutex> lock(mu_);
    held_++;
    cv_.notify_all();
    cv_.wait(lock, [&] { return !closed_; });
    held_--;
  }
  // Returns once n threads wait at the gate.
  void WaitForHeld(int n) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return held_ >= n; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool closed_ = false;
  int held_ = 0;
};

// Slots are byte vectors; a failed write leaves the slot garbage (as NvmeStore makes it
// unreadable). Faults: the next `fail_writes` writes / `fail_reads` reads fail with
// IoError. A gate holds writes in flight until it opens (race tests). Outlives the
// manager when the test keeps a reference (crash tests).
class MemorySlotBackend : public SlotBackend {
 public:
  MemorySlotBackend(uint64_t slot_size, uint64_t slots) : slot_size_(slot_size), data_(slots) {
    for (uint64_t i = 0; i < slots; ++i) free_.push_back(static_cast<uint32_t>(slots - 1 - i));
  }
  uint64_t slot_size() const override { return slot_size_; }
  uint64_t free_slots() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return free_.size();
  }
  Result<uint32_t> AllocateSlot() override {
    std::lock_guard<std::mutex> lock(mu_);
    if (free_.empty()) return OutOfBudgetError("memory backend full");
    uint32_t s = free_.back();
    free_.pop_back();
    return s;
  }
  Status FreeSlot(uint32_t slot) override {
    std::lock_guard<std::mutex> lock(mu_);
    free_.push_back(slot);
    return OkStatus();
  }
  Status WriteSlots(std::span<const uint32_t> slots, const void* buffer, uint64_t length) override {
    write_gate.Pass();
    std::lock_guard<std::mutex> lock(mu_);
    writes_++;
    bool fail = fail_writes_ > 0;
    if (fail) fail_writes_--;
    const auto* p = static_cast<const std::byte*>(buffer);
    for (size_t i = 0; i < slots.size() && i * slot_size_ < length; ++i) {
      uint64_t len = std::min(slot_size_, length - i * slot_size_);
      auto& d = data_[slots[i]];
      if (fail) {
        d.assign(len, std::byte{0xEE});  // torn
      } else {
        d.assign(p + i * slot_size_, p + i * slot_size_ + len);
      }
    }
    return fail ? IoError("injected write error") : OkStatus();
  }
  Status ReadSlots(std::span<const uint32_t> slots, void* buffer, uint64_t length) override {
    std::lock_guard<std::mutex> lock(mu_);
    reads_++;
    if (fail_reads_ > 0) {
      fail_reads_--;
      return IoError("injected read error");
    }
    auto* p = static_cast<std::byte*>(buffer);
    for (size_t i = 0; i < slots.size() && i * slot_size_ < length; ++i) {
      uint64_t len = std::min(slot_size_, length - i * slot_size_);
      const auto& d = data_[slots[i]];
      if (d.size() != len) return IoError("read of a slot never written");
      std::memcpy(p + i * slot_size_, d.data(), len);
    }
    return OkStatus();
  }
  std::string name() const override { return "memory"; }

  void FailWrites(int n) {
    std::lock_guard<std::mutex> lock(mu_);
    fail_writes_ = n;
  }
  void FailReads(int n) {
    std::lock_guard<std::mutex> lock(mu_);
    fail_reads_ = n;
  }
  // Every write passes it first: while it is closed, writes wait in flight.
  Gate write_gate;

  uint64_t writes() const {
    std::lock_guard<std::mutex> lock(mu_);
    return writes_;
  }
  uint64_t reads() const {
    std::lock_guard<std::mutex> lock(mu_);
    return reads_;
  }
  // Copies of every slot's bytes (for crash checks).
  std::vector<std::vector<std::byte>> Snapshot() const {
    std::lock_guard<std::mutex> lock(mu_);
    return data_;
  }

 private:
  const uint64_t slot_size_;
  mutable std::mutex mu_;
  std::vector<std::vector<std::byte>> data_;
  std::vector<uint32_t> free_;
  int fail_writes_ = 0;
  int fail_reads_ = 0;
  uint64_t writes_ = 0;
  uint64_t reads_ = 0;
};

struct TierEnv {
  std::unique_ptr<Device> device;
  std::unique_ptr<HostArena> arena;
  std::shared_ptr<MemorySlotBackend> nvme;
  std::unique_ptr<TierManager> tm;
};

struct TierEnvOptions {
  uint32_t chunks = 8;
  uint64_t chunk_elements = 2048;  // one 4 KiB block per chunk for a 2-byte plane
  std::vector<PlaneSpec> planes = {{"p16", 2}, {"f32", 4}};
  TierBudgets budgets{16 << 10, 32 << 10, 0};
  uint64_t nvme_slots = 256;
  uint64_t nvme_slot_bytes = 4096;
  TierPolicy policy = TierPolicy::kLru;
  bool synchronous = false;
  int max_prefetch_moves = 8;
  // When set, the manager uses the device this returns around the sim device.
  std::function<std::unique_ptr<Device>(std::unique_ptr<Device>)> wrap_device;
};

inline TierEnv MakeTierEnv(const TierEnvOptions& o) {
  TierEnv env;
  DeviceOptions d;
  d.kind = DeviceKind::kSim;
  d.capacity = 64 << 20;
  auto device = CreateDevice(d);
  EXPECT_TRUE(device.ok()) << device.status().ToString();
  env.device = std::move(device).value();
  if (o.wrap_device) env.device = o.wrap_device(std::move(env.device));
  HostArenaOptions ha;
  ha.bytes = 2 << 20;
  ha.huge_pages = false;
  ha.pinning = HostPinning::kMlock;
  auto arena = HostArena::Create(ha);
  EXPECT_TRUE(arena.ok()) << arena.status().ToString();
  env.arena = std::move(arena).value();
  env.nvme = std::make_shared<MemorySlotBackend>(o.nvme_slot_bytes, o.nvme_slots);
  TierManagerOptions t;
  auto layout = ChunkLayout::Create(o.chunks * o.chunk_elements, o.chunk_elements, 1, 0, 2048);
  EXPECT_TRUE(layout.ok()) << layout.status().ToString();
  t.layout = *layout;
  t.planes = o.planes;
  t.budgets = o.budgets;
  t.budgets.nvme = o.nvme_slots * o.nvme_slot_bytes;
  t.policy = o.policy;
  t.device = env.device.get();
  t.host_arena = env.arena.get();
  t.nvme_backend = env.nvme;
  t.synchronous = o.synchronous;
  t.max_prefetch_moves = o.max_prefetch_moves;
  auto tm = TierManager::Create(std::move(t));
  EXPECT_TRUE(tm.ok()) << tm.status().ToString();
  env.tm = std::move(tm).value();
  return env;
}

inline std::vector<std::byte> Pattern(uint64_t bytes, uint64_t seed) {
  std::vector<std::byte> v(bytes);
  std::mt19937_64 rng(seed * 0x9E3779B97F4A7C15ull + 1);
  for (uint64_t i = 0; i < bytes; i += 8) {
    uint64_t x = rng();
    std::memcpy(v.data() + i, &x, std::min<uint64_t>(8, bytes - i));
  }
  return v;
}

}  // namespace strata::testing
