// SlotBackend over NvmeStore: a block's slots are written and read in parallel (each
// slot is itself striped over the swap paths), then every handle is waited for.
#include <algorithm>

#include "strata/nvme_store.h"
#include "tiering/tier_internal.h"

namespace strata::tiering {
namespace {

class NvmeStoreBackend final : public SlotBackend {
 public:
  explicit NvmeStoreBackend(std::unique_ptr<NvmeStore> store) : store_(std::move(store)) {}

  uint64_t slot_size() const override { return store_->slot_size(); }
  uint64_t free_slots() const override { return store_->free_slots(); }
  Result<uint32_t> AllocateSlot() override {
    STRATA_ASSIGN_OR_RETURN(SlotId slot, store_->Allocate());
    return static_cast<uint32_t>(slot);
  }
  Status FreeSlot(uint32_t slot) override { return store_->Free(slot); }

  Status WriteSlots(std::span<const uint32_t> slots, const void* buffer, uint64_t length) override {
    return Transfer(slots, const_cast<void*>(buffer), length, true);
  }
  Status ReadSlots(std::span<const uint32_t> slots, void* buffer, uint64_t length) override {
    return Transfer(slots, buffer, length, false);
  }
  std::string name() const override {
    std::string s;
    for (const std::string& f : store_->files()) s += (s.empty() ? "" : ", ") + f;
    return s;
  }

 private:
  Status Transfer(std::span<const uint32_t> slots, void* buffer, uint64_t length, bool write) {
    const uint64_t unit = store_->slot_size();
    std::vector<IoHandle> handles;
    handles.reserve(slots.size());
    Status first;
    auto* p = static_cast<std::byte*>(buffer);
    for (size_t i = 0; i < slots.size() && uint64_t{i} * unit < length; ++i) {
      uint64_t off = uint64_t{i} * unit;
      uint64_t len = std::min(unit, length - off);
      Result<IoHandle> h = write ? store_->Write(slots[i], p + off, len) : store_->Read(slots[i], p + off, len);
      if (!h.ok()) {
        first = h.status();
        break;  // nothing more is queued; wait for what was
      }
      handles.push_back(*h);
    }
    for (const IoHandle& h : handles) {
      Status s = h.Wait();
      if (first.ok() && !s.ok()) first = s;
    }
    return first;
  }
  std::unique_ptr<NvmeStore> store_;
};

}  // namespace

Result<std::shared_ptr<SlotBackend>> OpenNvmeSlotBackend(IoEngine& engine, const NvmeStoreOptions& options) {
  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<NvmeStore> store, NvmeStore::Open(engine, options));
  return std::shared_ptr<SlotBackend>(std::make_shared<NvmeStoreBackend>(std::move(store)));
}

}  // namespace strata::tiering
