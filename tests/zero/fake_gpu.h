// A Device that says it is a GPU (kind cuda, not host-accessible) and can do nothing
// else: enough for the checks Engine::Create makes of its resources before it touches
// the device, on machines without a GPU.
#pragma once

#include "strata/device.h"

namespace strata::testing {

class FakeGpu final : public Device {
 public:
  DeviceKind kind() const override { return DeviceKind::kCuda; }
  std::string name() const override { return "fake GPU (cuda:0)"; }
  std::string pci_bus_id() const override { return ""; }
  bool host_accessible() const override { return false; }
  uint64_t capacity() const override { return 1ull << 30; }
  uint64_t allocated() const override { return 0; }
  uint64_t high_water() const override { return 0; }
  void ResetHighWater() override {}
  Result<void*> Allocate(uint64_t) override { return Refuse(); }
  void Free(void*) override {}
  Result<StreamId> CreateStream(std::string) override { return Refuse(); }
  std::string_view StreamName(StreamId) const override { return "?"; }
  Status CopyAsync(StreamId, void*, const void*, uint64_t, CopyDir) override { return Refuse(); }
  Status CopySync(void*, const void*, uint64_t, CopyDir) override { return Refuse(); }
  Status Enqueue(StreamId, std::function<Status()>) override { return Refuse(); }
  Result<std::shared_ptr<Event>> Record(StreamId) override { return Refuse(); }
  Status Wait(StreamId, const Event&) override { return Refuse(); }
  Status Synchronize(StreamId) override { return Refuse(); }
  Status SynchronizeAll() override { return OkStatus(); }
  void* NativeStream(StreamId) const override { return nullptr; }

 private:
  static Status Refuse() {
    return FailedPreconditionError("fake GPU: the engine was expected to stop before this");
  }
};

}  // namespace strata::testing
