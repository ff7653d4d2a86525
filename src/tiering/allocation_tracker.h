// Capacity accounting and pointer-range look-up for a device's allocations, shared by
// the sim and cuda backends. Thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>

#include "strata/status.h"

namespace strata::tiering {

inline constexpr uint64_t kDeviceAlignment = 256;

class AllocationTracker {
 public:
  AllocationTracker(std::string device_name, uint64_t capacity)
      : device_name_(std::move(device_name)), capacity_(capacity) {}

  // Reserves room for `bytes` (rounded up to kDeviceAlignment) or returns OutOfBudget
  // naming the request, the capacity and what is allocated. Returns the rounded size.
  Result<uint64_t> Reserve(uint64_t bytes);
  // Gives back a reservation whose allocation failed.
  void Unreserve(uint64_t rounded);
  // Records a live allocation of `rounded` bytes (after a successful Reserve).
  void Insert(void* ptr, uint64_t rounded);
  // Forgets an allocation; returns its rounded size. An unknown pointer aborts.
  uint64_t Remove(void* ptr);

  // OK when [ptr, ptr + bytes) lies inside one live allocation; InvalidArgument
  // naming `what` otherwise.
  Status CheckRange(const void* ptr, uint64_t bytes, const char* what) const;
  // True when ptr lies inside any live allocation.
  bool IsDevicePointer(const void* ptr) const;

  uint64_t capacity() const { return capacity_; }
  uint64_t allocated() const;
  uint64_t high_water() const;
  void ResetHighWater();
  // Every live allocation (for the destructor).
  std::map<uintptr_t, uint64_t> Snapshot() const;

 private:
  const std::string device_name_;
  const uint64_t capacity_;
  mutable std::mutex mu_;
  std::map<uintptr_t, uint64_t> live_;  // start -> rounded size
  uint64_t allocated_ = 0;
  uint64_t high_water_ = 0;
};

// Checks a copy's pointers against the direction: the device side must lie inside one
// live allocation and the host side must not be device memory (which would fail on
// cuda with the wrong cudaMemcpyKind). InvalidArgument naming the direction otherwise.
Status ValidateCopy(const AllocationTracker& tracker, const void* dst, const void* src, uint64_t bytes,
                    const char* dir_name, bool dst_on_device, bool src_on_device);

}  // namespace strata::tiering
