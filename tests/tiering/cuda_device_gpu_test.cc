// The cuda device on a real GPU: allocation against capacity, copies, stream order,
// events across streams, host work and its failures. Skips where there is no GPU.
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "strata/device.h"
#include "strata/host_arena.h"

namespace strata {
namespace {

class CudaDeviceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    CudaProbe probe = ProbeCuda();
    if (!probe.available) GTEST_SKIP() << "no usable GPU: " << probe.reason;
    auto d = CreateDevice({DeviceKind::kCuda, 0, 1ull << 30});
    ASSERT_TRUE(d.ok()) << d.status().ToString();
    dev_ = std::move(d).value();
  }
  std::unique_ptr<Device> dev_;
};

TEST_F(CudaDeviceTest, ReportsItself) {
  EXPECT_EQ(dev_->kind(), DeviceKind::kCuda);
  EXPECT_FALSE(dev_->host_accessible());
  EXPECT_EQ(dev_->capacity(), 1ull << 30);
  EXPECT_FALSE(dev_->pci_bus_id().empty());
  auto info = QueryCudaDevice(0);
  ASSERT_TRUE(info.ok()) << info.status().ToString();
  EXPECT_GT(info->total_memory, 0u);
  EXPECT_GE(info->async_engines, 1);
}

TEST_F(CudaDeviceTest, CapacityIsEnforced) {
  auto a = dev_->Allocate(768ull << 20);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  auto b = dev_->Allocate(512ull << 20);
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), StatusCode::kOutOfBudget);
  dev_->Free(*a);
  EXPECT_EQ(dev_->allocated(), 0u);
  EXPECT_EQ(dev_->high_water(), 768ull << 20);
}

// DeviceOptions::model_bytes: the budget leaves room for what the model allocates itself.
TEST_F(CudaDeviceTest, LeavesRoomForTheModelsOwnMemory) {
  auto info = QueryCudaDevice(0);
  ASSERT_TRUE(info.ok()) << info.status().ToString();
  const uint64_t free = info->free_memory, slack = 64ull << 20;  // free memory drifts a little
  auto d = CreateDevice({DeviceKind::kCuda, 0, 0, free / 2});
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_LE((*d)->capacity(), free - free / 2 - free / 20 + slack);
  EXPECT_GE((*d)->capacity() + slack, free - free / 2 - free / 20);
  d->reset();
  auto over = CreateDevice({DeviceKind::kCuda, 0, free - free / 4, free / 2});
  ASSERT_FALSE(over.ok());
  EXPECT_EQ(over.status().code(), StatusCode::kOutOfBudget);
  EXPECT_NE(over.status().message().find("the model's own"), std::string::npos) << over.status().ToString();
  auto none = CreateDevice({DeviceKind::kCuda, 0, 0, free});
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.status().message().find("leaves no room"), std::string::npos) << none.status().ToString();
}

TEST_F(CudaDeviceTest, PinnedAndPageableRoundTrip) {
  const size_t n = 32 << 20;
  HostArenaOptions o;
  o.bytes = 2 * n;
  o.pinning = HostPinning::kCuda;
  auto arena = HostArena::Create(o);
  ASSERT_TRUE(arena.ok()) << arena.status().ToString();
  HostBlock in = *(*arena)->Allocate(n), out = *(*arena)->Allocate(n);
  auto* src = static_cast<uint8_t*>(in.data);
  for (size_t i = 0; i < n; ++i) src[i] = static_cast<uint8_t>(i * 7 + 1);
  std::memset(out.data, 0, n);
  StreamId s = *dev_->CreateStream("copy");
  void* a = *dev_->Allocate(n);
  void* b = *dev_->Allocate(n);
  ASSERT_TRUE(dev_->CopyAsync(s, a, in.data, n, CopyDir::kHostToDevice).ok());
  ASSERT_TRUE(dev_->CopyAsync(s, b, a, n, CopyDir::kDeviceToDevice).ok());
  ASSERT_TRUE(dev_->CopyAsync(s, out.data, b, n, CopyDir::kDeviceToHost).ok());
  ASSERT_TRUE(dev_->Synchronize(s).ok());
  EXPECT_EQ(std::memcmp(in.data, out.data, n), 0);
  std::vector<uint8_t> pageable(n, 0);
  ASSERT_TRUE(dev_->CopyAsync(s, pageable.data(), a, n, CopyDir::kDeviceToHost).ok());
  ASSERT_TRUE(dev_->Synchronize(s).ok());
  EXPECT_EQ(std::memcmp(in.data, pageable.data(), n), 0);
  std::vector<uint8_t> sync_back(n, 0);
  ASSERT_TRUE(dev_->CopySync(sync_back.data(), b, n, CopyDir::kDeviceToHost).ok());
  EXPECT_EQ(std::memcmp(in.data, sync_back.data(), n), 0);
  EXPECT_NE(dev_->NativeStream(s), nullptr);
  dev_->Free(a);
  dev_->Free(b);
}

TEST_F(CudaDeviceTest, EventsOrderStreamsAndHostWork) {
  const size_t n = 64 << 20;
  std::vector<uint32_t> host(n / 4);
  std::iota(host.begin(), host.end(), 0u);
  std::vector<uint32_t> back(n / 4, 0);
  StreamId h2d = *dev_->CreateStream("h2d"), d2h = *dev_->CreateStream("d2h");
  void* a = *dev_->Allocate(n);
  ASSERT_TRUE(dev_->CopyAsync(h2d, a, host.data(), n, CopyDir::kHostToDevice).ok());
  auto copied = *dev_->Record(h2d);
  ASSERT_TRUE(dev_->Wait(d2h, *copied).ok());
  ASSERT_TRUE(dev_->CopyAsync(d2h, back.data(), a, n, CopyDir::kDeviceToHost).ok());
  std::atomic<int> order{0};
  int seen = -1;
  ASSERT_TRUE(dev_->Enqueue(d2h,
                            [&] {
                              seen = order++;
                              return OkStatus();
                            })
                  .ok());
  auto done = *dev_->Record(d2h);
  EXPECT_TRUE(done->Wait().ok());
  EXPECT_TRUE(done->Ready());
  EXPECT_EQ(seen, 0);
  EXPECT_EQ(host, back);
  EXPECT_TRUE(dev_->SynchronizeAll().ok());
  dev_->Free(a);
}

TEST_F(CudaDeviceTest, HostWorkFailureSurfaces) {
  StreamId s = *dev_->CreateStream("s"), other = *dev_->CreateStream("other");
  int ran_after = 0;
  ASSERT_TRUE(dev_->Enqueue(s, [] { return IoError("injected"); }).ok());
  auto after = *dev_->Record(s);
  ASSERT_TRUE(dev_->Enqueue(s,
                            [&] {
                              ++ran_after;
                              return OkStatus();
                            })
                  .ok());
  ASSERT_TRUE(dev_->Wait(other, *after).ok());
  EXPECT_EQ(after->Wait().code(), StatusCode::kIoError);
  EXPECT_EQ(dev_->Synchronize(s).code(), StatusCode::kIoError);
  EXPECT_EQ(dev_->Synchronize(other).code(), StatusCode::kIoError);
  EXPECT_EQ(ran_after, 0);
  EXPECT_TRUE(dev_->Synchronize(s).ok());  // cleared
}

TEST_F(CudaDeviceTest, BadCopiesAreRejectedBeforeCuda) {
  StreamId s = *dev_->CreateStream("s");
  void* a = *dev_->Allocate(4096);
  std::vector<uint8_t> host(8192);
  EXPECT_EQ(dev_->CopyAsync(s, a, host.data(), 8192, CopyDir::kHostToDevice).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(dev_->CopyAsync(s, host.data(), a, 16, CopyDir::kHostToDevice).code(),
            StatusCode::kInvalidArgument);
  EXPECT_TRUE(dev_->Synchronize(s).ok());
  dev_->Free(a);
}

}  // namespace
}  // namespace strata
