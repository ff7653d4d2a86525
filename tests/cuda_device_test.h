// A gtest fixture for tests on the CUDA device: skips with the reason where there is no
// usable GPU, else gives a device, one stream and device buffers freed at the end.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "strata/device.h"

namespace strata::testing {

class CudaDeviceTest : public ::testing::Test {
 protected:
  explicit CudaDeviceTest(std::string stream_name) : stream_name_(std::move(stream_name)) {}
  void SetUp() override {
    const CudaProbe probe = ProbeCuda();
    if (!probe.available) GTEST_SKIP() << "no usable GPU: " << probe.reason;
    DeviceOptions o;
    o.kind = DeviceKind::kCuda;
    auto d = CreateDevice(o);
    ASSERT_TRUE(d.ok()) << d.status().ToString();
    device_ = std::move(*d);
    auto s = device_->CreateStream(stream_name_);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    stream_ = *s;
  }
  void TearDown() override {
    if (!device_) return;
    EXPECT_TRUE(device_->SynchronizeAll().ok());
    FreeBuffers();
  }
  // Device memory freed at TearDown (or FreeBuffers); nullptr, with a failure, on error.
  void* Allocate(uint64_t bytes) {
    auto p = device_->Allocate(bytes);
    EXPECT_TRUE(p.ok()) << p.status().ToString();
    if (!p.ok()) return nullptr;
    buffers_.push_back(*p);
    return *p;
  }
  void FreeBuffers() {
    for (void* p : buffers_) device_->Free(p);
    buffers_.clear();
  }

  std::unique_ptr<Device> device_;
  StreamId stream_{};
  std::vector<void*> buffers_;

 private:
  std::string stream_name_;
};

}  // namespace strata::testing
