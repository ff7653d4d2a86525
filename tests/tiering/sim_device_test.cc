// The sim device: capacity, stream order, events, copies, concurrency, failures.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <numeric>
#include <thread>
#include <vector>

#include "strata/device.h"

namespace strata {
namespace {

std::unique_ptr<Device> MakeSim(uint64_t capacity = 64 << 20) {
  auto d = CreateDevice({DeviceKind::kSim, 0, capacity});
  EXPECT_TRUE(d.ok()) << d.status().ToString();
  return std::move(d).value();
}

TEST(SimDevice, ReportsKindNameAndDefaultCapacity) {
  auto d = CreateDevice({DeviceKind::kSim, 0, 0});
  ASSERT_TRUE(d.ok());
  EXPECT_EQ((*d)->kind(), DeviceKind::kSim);
  EXPECT_EQ((*d)->capacity(), kDefaultSimCapacity);
  EXPECT_TRUE((*d)->host_accessible());
  EXPECT_EQ((*d)->pci_bus_id(), "");
  EXPECT_NE((*d)->name().find("sim"), std::string::npos);
}

TEST(SimDevice, CapacityIsEnforcedWithOutOfBudget) {
  auto d = MakeSim(1 << 20);
  auto a = d->Allocate(600 << 10);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(d->allocated(), 600u << 10);
  auto b = d->Allocate(500 << 10);
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), StatusCode::kOutOfBudget);
  // The message names the request, the capacity and what is allocated.
  const std::string& m = b.status().message();
  EXPECT_NE(m.find("500 KiB"), std::string::npos) << m;
  EXPECT_NE(m.find("1.00 MiB"), std::string::npos) << m;
  EXPECT_NE(m.find("600 KiB allocated"), std::string::npos) << m;
  EXPECT_EQ(d->allocated(), 600u << 10);  // a failed allocation leaves no trace
  d->Free(*a);
  EXPECT_EQ(d->allocated(), 0u);
  EXPECT_EQ(d->high_water(), 600u << 10);
  auto c = d->Allocate(1 << 20);  // all of it, once freed
  ASSERT_TRUE(c.ok());
  d->Free(*c);
  d->ResetHighWater();
  EXPECT_EQ(d->high_water(), 0u);
}

// On sim the model's memory is the host's: DeviceOptions::model_bytes changes nothing.
TEST(SimDevice, TheModelsOwnMemoryIsNotItsBudgets) {
  auto d = CreateDevice({DeviceKind::kSim, 0, 1ull << 20, 1ull << 40});
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ((*d)->capacity(), 1ull << 20);
}

TEST(SimDevice, AllocationsAreAlignedAndRounded) {
  auto d = MakeSim();
  auto a = d->Allocate(1);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(reinterpret_cast<uintptr_t>(*a) % 256, 0u);
  EXPECT_EQ(d->allocated(), 256u);
  EXPECT_EQ(d->Allocate(0).status().code(), StatusCode::kInvalidArgument);
  d->Free(*a);
}

TEST(SimDevice, CopiesRoundTrip) {
  auto d = MakeSim();
  StreamId s = *d->CreateStream("copy");
  const size_t n = 3 << 20;
  std::vector<uint8_t> in(n), out(n, 0);
  for (size_t i = 0; i < n; ++i) in[i] = static_cast<uint8_t>(i * 131 + 7);
  void* a = *d->Allocate(n);
  void* b = *d->Allocate(n);
  ASSERT_TRUE(d->CopyAsync(s, a, in.data(), n, CopyDir::kHostToDevice).ok());
  ASSERT_TRUE(d->CopyAsync(s, b, a, n, CopyDir::kDeviceToDevice).ok());
  ASSERT_TRUE(d->CopyAsync(s, out.data(), b, n, CopyDir::kDeviceToHost).ok());
  ASSERT_TRUE(d->Synchronize(s).ok());
  EXPECT_EQ(in, out);
  // The synchronous reference copy, with the same checks.
  std::vector<uint8_t> back(n, 0);
  ASSERT_TRUE(d->CopySync(a, in.data() + 1, n - 1, CopyDir::kHostToDevice).ok());
  ASSERT_TRUE(d->CopySync(back.data(), a, n - 1, CopyDir::kDeviceToHost).ok());
  EXPECT_TRUE(std::equal(back.begin(), back.end() - 1, in.begin() + 1));
  EXPECT_EQ(d->CopySync(a, in.data(), n + 1, CopyDir::kHostToDevice).code(), StatusCode::kInvalidArgument);
  d->Free(a);
  d->Free(b);
}

TEST(SimDevice, CopyArgumentsAreCheckedAtOnce) {
  auto d = MakeSim();
  StreamId s = *d->CreateStream("copy");
  std::vector<uint8_t> host(8192);
  void* dev = *d->Allocate(4096);
  // Overrunning the allocation.
  Status over = d->CopyAsync(s, dev, host.data(), 8192, CopyDir::kHostToDevice);
  EXPECT_EQ(over.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(over.message().find("overruns"), std::string::npos) << over.message();
  // Host memory where device memory belongs, and the reverse.
  EXPECT_EQ(d->CopyAsync(s, host.data(), host.data() + 4096, 16, CopyDir::kHostToDevice).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(d->CopyAsync(s, dev, dev, 16, CopyDir::kDeviceToHost).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(d->CopyAsync(s, nullptr, host.data(), 16, CopyDir::kDeviceToHost).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(d->CopyAsync(StreamId{}, dev, host.data(), 16, CopyDir::kHostToDevice).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(d->CopyAsync(StreamId{7}, dev, host.data(), 16, CopyDir::kHostToDevice).code(),
            StatusCode::kInvalidArgument);
  EXPECT_TRUE(d->CopyAsync(s, dev, host.data(), 0, CopyDir::kHostToDevice).ok());
  EXPECT_TRUE(d->Synchronize(s).ok());
  d->Free(dev);
}

TEST(SimDevice, StreamRunsInEnqueueOrderOnOneThread) {
  auto d = MakeSim();
  StreamId s = *d->CreateStream("compute");
  std::vector<int> order;
  std::vector<std::thread::id> threads;
  for (int i = 0; i < 200; ++i) {
    ASSERT_TRUE(d->Enqueue(s, [&, i] {
                   if (i % 50 == 0) std::this_thread::sleep_for(std::chrono::milliseconds(2));
                   order.push_back(i);
                   threads.push_back(std::this_thread::get_id());
                   return OkStatus();
                 }).ok());
  }
  ASSERT_TRUE(d->Synchronize(s).ok());
  std::vector<int> expected(200);
  std::iota(expected.begin(), expected.end(), 0);
  EXPECT_EQ(order, expected);
  for (auto id : threads) EXPECT_EQ(id, threads[0]);
  EXPECT_NE(threads[0], std::this_thread::get_id());
}

TEST(SimDevice, EventsCompleteAfterPriorWork) {
  auto d = MakeSim();
  StreamId s = *d->CreateStream("s");
  std::atomic<bool> release{false};
  std::atomic<int> ran{0};
  ASSERT_TRUE(d->Enqueue(s, [&] {
                 while (!release.load()) std::this_thread::yield();
                 ++ran;
                 return OkStatus();
               }).ok());
  auto e = d->Record(s);
  ASSERT_TRUE(e.ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_FALSE((*e)->Ready());
  release = true;
  EXPECT_TRUE((*e)->Wait().ok());
  EXPECT_TRUE((*e)->Ready());
  EXPECT_EQ(ran.load(), 1);
  EXPECT_TRUE((*e)->Wait().ok());  // repeatable
}

TEST(SimDevice, WaitAcrossStreamsOrdersWork) {
  auto d = MakeSim();
  StreamId producer = *d->CreateStream("h2d");
  StreamId consumer = *d->CreateStream("compute");
  const size_t n = 1 << 20;
  std::vector<float> host(n / sizeof(float), 3.0f);
  void* dev = *d->Allocate(n);
  std::atomic<bool> release{false};
  // The producer is held back; the consumer must not run before the copy completes.
  ASSERT_TRUE(d->Enqueue(producer, [&] {
                 while (!release.load()) std::this_thread::yield();
                 return OkStatus();
               }).ok());
  ASSERT_TRUE(d->CopyAsync(producer, dev, host.data(), n, CopyDir::kHostToDevice).ok());
  auto copied = *d->Record(producer);
  ASSERT_TRUE(d->Wait(consumer, *copied).ok());
  copied.reset();  // the queued wait must keep the event alive
  double sum = -1;
  ASSERT_TRUE(d->Enqueue(consumer, [&] {
                 const float* f = static_cast<const float*>(dev);
                 sum = 0;
                 for (size_t i = 0; i < n / sizeof(float); ++i) sum += f[i];
                 return OkStatus();
               }).ok());
  auto done = *d->Record(consumer);
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_FALSE(done->Ready());
  release = true;
  ASSERT_TRUE(done->Wait().ok());
  EXPECT_EQ(sum, 3.0 * (n / sizeof(float)));
  ASSERT_TRUE(d->SynchronizeAll().ok());
  d->Free(dev);
}

TEST(SimDevice, StreamsRunConcurrently) {
  auto d = MakeSim();
  StreamId a = *d->CreateStream("a");
  StreamId b = *d->CreateStream("b");
  // Each stream waits for the other to have started: only concurrent streams finish.
  std::atomic<int> started{0};
  auto rendezvous = [&] {
    ++started;
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (started.load() < 2) {
      if (std::chrono::steady_clock::now() > deadline) return InternalError("the other stream never started");
      std::this_thread::yield();
    }
    return OkStatus();
  };
  ASSERT_TRUE(d->Enqueue(a, rendezvous).ok());
  ASSERT_TRUE(d->Enqueue(b, rendezvous).ok());
  EXPECT_TRUE(d->Synchronize(a).ok());
  EXPECT_TRUE(d->Synchronize(b).ok());
}

TEST(SimDevice, ConcurrentCopiesOnManyStreams) {
  auto d = MakeSim(256 << 20);
  constexpr int kStreams = 4;
  const size_t n = 4 << 20;
  std::vector<std::vector<uint8_t>> in(kStreams), out(kStreams);
  std::vector<void*> dev(kStreams);
  std::vector<std::thread> callers;
  for (int k = 0; k < kStreams; ++k) {
    in[k].assign(n, static_cast<uint8_t>(k + 1));
    out[k].assign(n, 0);
    dev[k] = *d->Allocate(n);
  }
  for (int k = 0; k < kStreams; ++k) {
    callers.emplace_back([&, k] {
      StreamId s = *d->CreateStream("s" + std::to_string(k));
      for (int rep = 0; rep < 4; ++rep) {
        EXPECT_TRUE(d->CopyAsync(s, dev[k], in[k].data(), n, CopyDir::kHostToDevice).ok());
        EXPECT_TRUE(d->CopyAsync(s, out[k].data(), dev[k], n, CopyDir::kDeviceToHost).ok());
      }
      EXPECT_TRUE(d->Synchronize(s).ok());
    });
  }
  for (auto& t : callers) t.join();
  for (int k = 0; k < kStreams; ++k) {
    EXPECT_EQ(in[k], out[k]) << "stream " << k;
    d->Free(dev[k]);
  }
}

TEST(SimDevice, FailureSkipsLaterWorkAndSurfacesOnce) {
  auto d = MakeSim();
  StreamId s = *d->CreateStream("s");
  StreamId other = *d->CreateStream("other");
  int ran_after = 0;
  auto before = *d->Record(s);
  ASSERT_TRUE(d->Enqueue(s, [] { return IoError("disk on fire"); }).ok());
  auto after = *d->Record(s);
  ASSERT_TRUE(d->Enqueue(s, [&] {
                 ++ran_after;
                 return OkStatus();
               }).ok());
  ASSERT_TRUE(d->Wait(other, *after).ok());
  EXPECT_TRUE(before->Wait().ok());
  Status e = after->Wait();
  EXPECT_EQ(e.code(), StatusCode::kIoError);
  EXPECT_NE(e.message().find("disk on fire"), std::string::npos);
  Status sync = d->Synchronize(s);
  EXPECT_EQ(sync.code(), StatusCode::kIoError);
  EXPECT_EQ(ran_after, 0);
  // The waiting stream inherited the failure.
  Status inherited = d->Synchronize(other);
  EXPECT_EQ(inherited.code(), StatusCode::kIoError);
  EXPECT_NE(inherited.message().find("other"), std::string::npos) << inherited.message();
  // Synchronize cleared it: the stream works again.
  ASSERT_TRUE(d->Enqueue(s, [&] {
                 ++ran_after;
                 return OkStatus();
               }).ok());
  EXPECT_TRUE(d->Synchronize(s).ok());
  EXPECT_EQ(ran_after, 1);
}

TEST(SimDevice, RejectsForeignEventsAndTooManyStreams) {
  auto d1 = MakeSim();
  auto d2 = MakeSim();
  StreamId s1 = *d1->CreateStream("a");
  StreamId s2 = *d2->CreateStream("b");
  auto e = *d1->Record(s1);
  EXPECT_EQ(d2->Wait(s2, *e).code(), StatusCode::kInvalidArgument);
  for (int i = 1; i < 64; ++i) ASSERT_TRUE(d1->CreateStream("x").ok());
  EXPECT_EQ(d1->CreateStream("one too many").status().code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(d1->NativeStream(s1), nullptr);
  EXPECT_EQ(d1->StreamName(s1), "a");
}

TEST(DeviceFactory, CudaWithoutGpuSaysWhyAndHowOut) {
  CudaProbe probe = ProbeCuda();
  if (probe.available) GTEST_SKIP() << "a GPU is present; this checks the message where there is none";
  auto d = CreateDevice({DeviceKind::kCuda, 0, 0});
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(d.status().message().find("--device sim"), std::string::npos) << d.status().message();
  EXPECT_NE(d.status().message().find(probe.reason), std::string::npos) << d.status().message();
#ifdef STRATA_HAVE_CUDA
  EXPECT_NE(probe.reason.find("cudaGetDeviceCount"), std::string::npos) << probe.reason;
#endif
  auto a = CreateDevice({DeviceKind::kAuto, 0, 1 << 20});
  ASSERT_TRUE(a.ok());
  EXPECT_EQ((*a)->kind(), DeviceKind::kSim);
  EXPECT_EQ((*a)->capacity(), 1u << 20);
}

}  // namespace
}  // namespace strata
