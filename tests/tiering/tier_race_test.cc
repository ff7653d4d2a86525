// Races the randomized model test meets only by chance, made deterministic with the test
// backend's write gate: a write-back held in flight while a newer version of the block
// is written on another tier.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <functional>
#include <future>
#include <thread>

#include "tier_test_util.h"

namespace strata {
namespace {

using testing::Gate;
using testing::MakeTierEnv;
using testing::Pattern;
using testing::TierEnv;
using testing::TierEnvOptions;

// Runs `open` when it goes out of scope (before the futures it was declared after).
class OpenOnExit {
 public:
  explicit OpenOnExit(std::function<void()> open) : open_(std::move(open)) {}
  ~OpenOnExit() { open_(); }

 private:
  std::function<void()> open_;
};

// The sim device, except that device-to-host copies wait at a gate and, once it opens,
// fail with IoError (a failed eviction copy).
class FailingD2HDevice : public Device {
 public:
  explicit FailingD2HDevice(std::unique_ptr<Device> inner) : inner_(std::move(inner)) { gate.Close(); }
  Gate gate;

  DeviceKind kind() const override { return inner_->kind(); }
  std::string name() const override { return inner_->name(); }
  std::string pci_bus_id() const override { return inner_->pci_bus_id(); }
  bool host_accessible() const override { return inner_->host_accessible(); }
  uint64_t capacity() const override { return inner_->capacity(); }
  uint64_t allocated() const override { return inner_->allocated(); }
  uint64_t high_water() const override { return inner_->high_water(); }
  void ResetHighWater() override { inner_->ResetHighWater(); }
  Result<void*> Allocate(uint64_t bytes) override { return inner_->Allocate(bytes); }
  void Free(void* ptr) override { inner_->Free(ptr); }
  Result<StreamId> CreateStream(std::string name) override { return inner_->CreateStream(std::move(name)); }
  std::string_view StreamName(StreamId stream) const override { return inner_->StreamName(stream); }
  Status CopyAsync(StreamId stream, void* dst, const void* src, uint64_t bytes, CopyDir dir) override {
    if (dir != CopyDir::kDeviceToHost) return inner_->CopyAsync(stream, dst, src, bytes, dir);
    gate.Pass();
    return IoError("injected device-to-host copy failure");
  }
  Status CopySync(void* dst, const void* src, uint64_t bytes, CopyDir dir) override {
    return inner_->CopySync(dst, src, bytes, dir);
  }
  Status Enqueue(StreamId stream, std::function<Status()> fn) override {
    return inner_->Enqueue(stream, std::move(fn));
  }
  Result<std::shared_ptr<Event>> Record(StreamId stream) override { return inner_->Record(stream); }
  Status Wait(StreamId stream, const Event& event) override { return inner_->Wait(stream, event); }
  Status Synchronize(StreamId stream) override { return inner_->Synchronize(stream); }
  Status SynchronizeAll() override { return inner_->SynchronizeAll(); }
  void* NativeStream(StreamId stream) const override { return inner_->NativeStream(stream); }

 private:
  std::unique_ptr<Device> inner_;
};

// Polls instead of Wait(): a stranded ticket must fail the test, not hang it.
bool ReadyWithin(const BlockHandle& h, std::chrono::seconds limit) {
  auto deadline = std::chrono::steady_clock::now() + limit;
  while (!h.Ready()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

// Writes `bytes` as the block's new version through an acquisition on `tier`.
Status WriteVersion(TierEnv& env, BlockId id, Tier tier, const std::vector<std::byte>& bytes) {
  STRATA_ASSIGN_OR_RETURN(BlockHandle h, env.tm->Acquire(id, tier, Access::kOverwrite));
  if (!ReadyWithin(h, std::chrono::seconds(10))) return InternalError("acquisition not ready in 10 s");
  STRATA_RETURN_IF_ERROR(h.Wait());
  if (tier == Tier::kHost) {
    std::memcpy(h.data(), bytes.data(), bytes.size());
    return OkStatus();
  }
  return env.device->CopySync(h.data(), bytes.data(), bytes.size(), CopyDir::kHostToDevice);
}

// A host copy being written back to NVMe turns stale when the device copy is written.
// A later host acquisition must wait for that write-back and load the new bytes; it
// used to take the stale leaving copy back as valid, drop its load, and never become
// ready (seen as a rare hang of seed 23 in tier_model_test).
TEST(TierRaceTest, StaleCopyLeavingForNvmeIsNotTakenBack) {
  TierEnvOptions o;
  o.budgets = {16 << 10, 32 << 10, 0};
  auto env = MakeTierEnv(o);
  TierManager& tm = *env.tm;
  const BlockId id{0, 0, kWholeChunk};
  const uint64_t bytes = tm.BlockBytes(id);
  ASSERT_TRUE(tm.Register(id, Tier::kNvme, Pattern(bytes, 1)).ok());

  // Version 2 on the host only (NVMe still holds version 1).
  ASSERT_TRUE(WriteVersion(env, id, Tier::kHost, Pattern(bytes, 2)).ok());

  // Its write-back to NVMe is held in flight; Evict waits for it on another thread.
  env.nvme->write_gate.Close();
  auto evicted = std::async(std::launch::async, [&] { return tm.Evict(id, Tier::kHost); });
  OpenOnExit open_gate([&] { env.nvme->write_gate.Open(); });  // a failed ASSERT must not hang
  env.nvme->write_gate.WaitForHeld(1);

  // Version 3 on the device: the leaving host copy is stale now.
  std::vector<std::byte> v3 = Pattern(bytes, 3);
  ASSERT_TRUE(WriteVersion(env, id, Tier::kDevice, v3).ok());

  auto reader = tm.Acquire(id, Tier::kHost, Access::kRead);
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  env.nvme->write_gate.Open();
  bool ready = ReadyWithin(*reader, std::chrono::seconds(10));
  EXPECT_TRUE(ready) << "the host acquisition was never made ready";
  ASSERT_EQ(evicted.wait_for(std::chrono::seconds(10)), std::future_status::ready);
  Status evict = evicted.get();
  EXPECT_TRUE(evict.ok()) << evict.ToString();
  if (!ready) return;
  ASSERT_TRUE(reader->Wait().ok());
  EXPECT_EQ(std::memcmp(reader->data(), v3.data(), bytes), 0)
      << "the host copy is not the device's newer bytes";
}

// A host acquisition that arrives while the block's device copy is being evicted to the
// host waits for that copy. When the copy fails, the acquisition must hear the error; it
// used to be left pending with nothing to wake it.
TEST(TierRaceTest, FailedEvictionCopyFailsTheAcquisitionWaitingForIt) {
  TierEnvOptions o;
  o.budgets = {16 << 10, 32 << 10, 0};
  FailingD2HDevice* failing = nullptr;
  o.wrap_device = [&](std::unique_ptr<Device> sim) {
    auto d = std::make_unique<FailingD2HDevice>(std::move(sim));
    failing = d.get();
    return std::unique_ptr<Device>(std::move(d));
  };
  auto env = MakeTierEnv(o);
  ASSERT_NE(failing, nullptr);
  TierManager& tm = *env.tm;
  const BlockId id{0, 0, kWholeChunk};
  const uint64_t bytes = tm.BlockBytes(id);
  ASSERT_TRUE(tm.Register(id, Tier::kNvme, Pattern(bytes, 1)).ok());

  // Version 2 on the device only.
  std::vector<std::byte> v2 = Pattern(bytes, 2);
  ASSERT_TRUE(WriteVersion(env, id, Tier::kDevice, v2).ok());

  auto evicted = std::async(std::launch::async, [&] { return tm.Evict(id, Tier::kDevice); });
  OpenOnExit open_gate([&] { failing->gate.Open(); });
  failing->gate.WaitForHeld(1);
  auto reader = tm.Acquire(id, Tier::kHost, Access::kRead);
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  failing->gate.Open();

  ASSERT_TRUE(ReadyWithin(*reader, std::chrono::seconds(10)))
      << "the host acquisition was left pending after the copy it waited for failed";
  Status s = reader->Wait();
  EXPECT_EQ(s.code(), StatusCode::kIoError) << s.ToString();
  ASSERT_EQ(evicted.wait_for(std::chrono::seconds(10)), std::future_status::ready);
  Status e = evicted.get();
  EXPECT_EQ(e.code(), StatusCode::kIoError) << e.ToString();
  // The device copy stays the valid one and reads back.
  auto again = tm.Acquire(id, Tier::kDevice, Access::kRead);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  ASSERT_TRUE(again->Wait().ok());
  std::vector<std::byte> back(bytes);
  ASSERT_TRUE(env.device->CopySync(back.data(), again->data(), bytes, CopyDir::kDeviceToHost).ok());
  EXPECT_EQ(back, v2);
}

}  // namespace
}  // namespace strata
