#include "tiering/allocation_tracker.h"

#include <algorithm>
#include <sstream>

#include "strata/units.h"

namespace strata::tiering {

Result<uint64_t> AllocationTracker::Reserve(uint64_t bytes) {
  if (bytes == 0)
    return InvalidArgumentError("device " + device_name_ +
                                ": Allocate(0): a device allocation needs at least one byte");
  if (bytes > UINT64_MAX - kDeviceAlignment)
    return InvalidArgumentError("device " + device_name_ + ": Allocate: size overflows");
  uint64_t rounded = (bytes + kDeviceAlignment - 1) & ~(kDeviceAlignment - 1);
  std::lock_guard<std::mutex> lock(mu_);
  if (rounded > capacity_ - std::min(capacity_, allocated_)) {
    std::ostringstream msg;
    msg << "device " << device_name_ << ": cannot allocate " << FormatBytes(bytes) << " (" << bytes
        << " B): capacity " << FormatBytes(capacity_) << ", " << FormatBytes(allocated_) << " allocated, "
        << FormatBytes(capacity_ - std::min(capacity_, allocated_))
        << " free; free or evict device blocks first, or raise strata.device_budget";
    return OutOfBudgetError(msg.str());
  }
  allocated_ += rounded;
  high_water_ = std::max(high_water_, allocated_);
  return rounded;
}

void AllocationTracker::Unreserve(uint64_t rounded) {
  std::lock_guard<std::mutex> lock(mu_);
  STRATA_CHECK(allocated_ >= rounded);
  allocated_ -= rounded;
}

void AllocationTracker::Insert(void* ptr, uint64_t rounded) {
  std::lock_guard<std::mutex> lock(mu_);
  bool inserted = live_.emplace(reinterpret_cast<uintptr_t>(ptr), rounded).second;
  STRATA_CHECK_MSG(inserted, "device " + device_name_ + ": the same pointer allocated twice");
}

uint64_t AllocationTracker::Remove(void* ptr) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = live_.find(reinterpret_cast<uintptr_t>(ptr));
  STRATA_CHECK_MSG(it != live_.end(),
                   "device " + device_name_ + ": Free() of a pointer that is not a live allocation");
  uint64_t rounded = it->second;
  live_.erase(it);
  allocated_ -= rounded;
  return rounded;
}

Status AllocationTracker::CheckRange(const void* ptr, uint64_t bytes, const char* what) const {
  auto p = reinterpret_cast<uintptr_t>(ptr);
  std::lock_guard<std::mutex> lock(mu_);
  auto it = live_.upper_bound(p);
  if (it != live_.begin()) {
    --it;
    if (p >= it->first && p - it->first < it->second) {
      if (bytes <= it->second - (p - it->first)) return OkStatus();
      std::ostringstream msg;
      msg << "device " << device_name_ << ": " << what << " [" << ptr << ", +" << bytes
          << ") overruns its allocation of " << it->second << " B at offset " << (p - it->first);
      return InvalidArgumentError(msg.str());
    }
  }
  std::ostringstream msg;
  msg << "device " << device_name_ << ": " << what << " " << ptr
      << " is not device memory from this device's Allocate()";
  return InvalidArgumentError(msg.str());
}

bool AllocationTracker::IsDevicePointer(const void* ptr) const {
  auto p = reinterpret_cast<uintptr_t>(ptr);
  std::lock_guard<std::mutex> lock(mu_);
  auto it = live_.upper_bound(p);
  if (it == live_.begin()) return false;
  --it;
  return p - it->first < it->second;
}

uint64_t AllocationTracker::allocated() const {
  std::lock_guard<std::mutex> lock(mu_);
  return allocated_;
}
uint64_t AllocationTracker::high_water() const {
  std::lock_guard<std::mutex> lock(mu_);
  return high_water_;
}
void AllocationTracker::ResetHighWater() {
  std::lock_guard<std::mutex> lock(mu_);
  high_water_ = allocated_;
}
std::map<uintptr_t, uint64_t> AllocationTracker::Snapshot() const {
  std::lock_guard<std::mutex> lock(mu_);
  return live_;
}

Status ValidateCopy(const AllocationTracker& tracker, const void* dst, const void* src, uint64_t bytes,
                    const char* dir_name, bool dst_on_device, bool src_on_device) {
  if (dst == nullptr || src == nullptr) {
    return InvalidArgumentError(std::string("CopyAsync ") + dir_name + ": null " +
                                (dst == nullptr ? "destination" : "source"));
  }
  std::string what = std::string(dir_name) + " destination";
  if (dst_on_device) {
    STRATA_RETURN_IF_ERROR(tracker.CheckRange(dst, bytes, what.c_str()));
  } else if (tracker.IsDevicePointer(dst)) {
    return InvalidArgumentError("CopyAsync " + std::string(dir_name) +
                                ": the destination is device memory; use D2D");
  }
  what = std::string(dir_name) + " source";
  if (src_on_device) {
    STRATA_RETURN_IF_ERROR(tracker.CheckRange(src, bytes, what.c_str()));
  } else if (tracker.IsDevicePointer(src)) {
    return InvalidArgumentError("CopyAsync " + std::string(dir_name) +
                                ": the source is device memory; use D2D");
  }
  return OkStatus();
}

}  // namespace strata::tiering
