// Every collective x dtype x size against a locally computed expectation, on the world
// and on sub-communicators, under mpirun -np 2 and -np 4.
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>

#include "comm_test_util.h"
#include "strata/comm.h"

namespace strata {
namespace {

using comm::test::Input;
using comm::test::Reduced;

Communicator& World() {
  static std::unique_ptr<Communicator> world = [] {
    CommOptions o;
    o.name = "collectives-test";
    o.collective_timeout_s = 60;  // a hang becomes a failure, not a ctest timeout
    auto w = InitWorld(o);
    STRATA_CHECK_MSG(w.ok(), w.status().ToString());
    return std::move(w).value();
  }();
  return *world;
}

std::string What(std::string_view op, DType d, size_t n, bool in_place) {
  return std::string(op) + " " + std::string(DTypeName(d)) + " n=" + std::to_string(n) +
         (in_place ? " in place" : "");
}

// Sizes per rank: 0, 1, uneven, several MiB (per dtype, about 3 MiB of payload).
// The largest: about 3 MiB in the full (size x count) buffer, not a multiple of 64.
std::vector<size_t> Counts(DType d, int p) {
  return {0, 1, 37, 1001, (size_t{3} << 20) / DTypeSize(d) / p + 5};
}

const DType kDTypes[] = {DType::kF32, DType::kBf16, DType::kFp16};

TEST(Collectives, AllGather) {
  Communicator& c = World();
  const int p = c.size();
  for (DType d : kDTypes) {
    for (size_t n : Counts(d, p)) {
      for (bool in_place : {false, true}) {
        const size_t ds = DTypeSize(d);
        std::vector<uint8_t> mine = Input(d, c.rank(), n, 11);
        std::vector<uint8_t> out(n * ds * p, 0xEE);
        const void* send = mine.data();
        if (in_place) {
          std::copy(mine.begin(), mine.end(), out.begin() + static_cast<long>(n * ds * c.rank()));
          send = out.data() + n * ds * c.rank();
        }
        ASSERT_TRUE(c.AllGather(send, out.data(), n, d).Wait().ok()) << What("AllGather", d, n, in_place);
        for (int r = 0; r < p; ++r) {
          std::vector<uint8_t> want = Input(d, r, n, 11);
          ASSERT_TRUE(std::equal(want.begin(), want.end(), out.begin() + static_cast<long>(n * ds * r)))
              << What("AllGather", d, n, in_place) << " block of rank " << r;
        }
      }
    }
  }
}

TEST(Collectives, ReduceScatter) {
  Communicator& c = World();
  const int p = c.size();
  for (DType d : kDTypes) {
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg}) {
      for (size_t n : Counts(d, p)) {
        const std::vector<uint8_t> full = Reduced(d, p, n * p, 23, op);
        const std::vector<uint8_t> input = Input(d, c.rank(), n * p, 23);
        for (bool in_place : {false, true}) {
          const size_t ds = DTypeSize(d);
          std::vector<uint8_t> send = input;
          std::vector<uint8_t> recv(n * ds, 0xEE);
          void* out = in_place ? send.data() + n * ds * c.rank() : recv.data();
          ASSERT_TRUE(c.ReduceScatter(send.data(), out, n, d, op).Wait().ok())
              << What("ReduceScatter", d, n, in_place);
          const uint8_t* got = static_cast<const uint8_t*>(out);
          ASSERT_TRUE(std::equal(got, got + n * ds, full.begin() + static_cast<long>(n * ds * c.rank())))
              << What("ReduceScatter", d, n, in_place) << " " << ReduceOpName(op);
        }
      }
    }
  }
}

TEST(Collectives, AllReduce) {
  Communicator& c = World();
  const int p = c.size();
  for (DType d : kDTypes) {
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg}) {
      // 1 and 3 give ranks with empty blocks; 1000003 is not a multiple of any size.
      for (size_t n :
           {size_t{0}, size_t{1}, size_t{3}, size_t{100003}, (size_t{3} << 20) / DTypeSize(d) + 1}) {
        const std::vector<uint8_t> want = Reduced(d, p, n, 37, op);
        const std::vector<uint8_t> input = Input(d, c.rank(), n, 37);
        for (bool in_place : {false, true}) {
          std::vector<uint8_t> send = input;
          std::vector<uint8_t> recv(n * DTypeSize(d), 0xEE);
          void* out = in_place ? send.data() : recv.data();
          ASSERT_TRUE(c.AllReduce(send.data(), out, n, d, op).Wait().ok())
              << What("AllReduce", d, n, in_place);
          const uint8_t* got = static_cast<const uint8_t*>(out);
          ASSERT_TRUE(std::equal(want.begin(), want.end(), got))
              << What("AllReduce", d, n, in_place) << " " << ReduceOpName(op);
        }
      }
    }
  }
}

TEST(Collectives, BroadcastFromEveryRoot) {
  Communicator& c = World();
  const int p = c.size();
  for (DType d : kDTypes) {
    for (size_t n : Counts(d, p)) {
      for (int root = 0; root < c.size(); ++root) {
        std::vector<uint8_t> buf = Input(d, c.rank(), n, 5);
        ASSERT_TRUE(c.Broadcast(buf.data(), n, d, root).Wait().ok());
        ASSERT_EQ(buf, Input(d, root, n, 5)) << What("Broadcast", d, n, false) << " root " << root;
      }
    }
  }
}

TEST(Collectives, ManyInFlightCompleteInOrder) {
  Communicator& c = World();
  const int p = c.size();
  constexpr int kOps = 16;
  std::vector<std::vector<uint8_t>> bufs;
  std::vector<CommHandle> handles;
  for (int k = 0; k < kOps; ++k) bufs.push_back(Input(DType::kF32, c.rank(), 1000 + k, 100 + k));
  for (int k = 0; k < kOps; ++k) {
    handles.push_back(c.AllReduce(bufs[k].data(), bufs[k].data(), 1000 + k, DType::kF32, ReduceOp::kSum));
  }
  handles.push_back(c.Barrier());
  for (auto& h : handles) ASSERT_TRUE(h.Wait().ok());
  for (int k = 0; k < kOps; ++k)
    EXPECT_EQ(bufs[k], Reduced(DType::kF32, p, 1000 + k, 100 + k, ReduceOp::kSum));
  // Test() on a finished handle says done, repeatedly.
  auto t = handles.back().Test();
  ASSERT_TRUE(t.ok());
  EXPECT_TRUE(*t);
}

// After synchronous use (Wait right after issue) Submit leaves the worker asleep; a
// caller that then only polls Test() must still see its collectives finish.
TEST(Collectives, PollingWithTestFinishesAfterSynchronousUse) {
  Communicator& c = World();
  for (int k = 0; k < 3; ++k) ASSERT_TRUE(c.Barrier().Wait().ok());
  std::vector<uint8_t> buf = Input(DType::kF32, c.rank(), 4096, 7);
  CommHandle h = c.AllReduce(buf.data(), buf.data(), 4096, DType::kF32, ReduceOp::kSum);
  for (;;) {
    Result<bool> done = h.Test();
    ASSERT_TRUE(done.ok()) << done.status().ToString();
    if (*done) break;
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  EXPECT_EQ(buf, Reduced(DType::kF32, c.size(), 4096, 7, ReduceOp::kSum));
}

// Submit reuses a finished op only once no handle refers to it: a handle kept while
// later collectives are issued still reports its own, finished collective.
TEST(Collectives, KeptHandleStaysFinishedWhileLaterOnesRun) {
  Communicator& c = World();
  const int p = c.size();
  std::vector<uint8_t> a = Input(DType::kF32, c.rank(), 1000, 11);
  CommHandle kept = c.AllReduce(a.data(), a.data(), 1000, DType::kF32, ReduceOp::kSum);
  ASSERT_TRUE(kept.Wait().ok());
  for (int k = 0; k < 4; ++k) {
    const size_t n = 500 + static_cast<size_t>(k);
    std::vector<uint8_t> b = Input(DType::kF32, c.rank(), n, 20 + k);
    CommHandle h = c.Broadcast(b.data(), n, DType::kF32, k % p);
    Result<bool> t = kept.Test();  // h is issued and (under synchronous use) not yet run
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    EXPECT_TRUE(*t);
    ASSERT_TRUE(h.Wait().ok());
    EXPECT_EQ(b, Input(DType::kF32, k % p, n, 20 + k));
  }
  EXPECT_TRUE(kept.Wait().ok());
  EXPECT_EQ(a, Reduced(DType::kF32, p, 1000, 11, ReduceOp::kSum));
}

TEST(Collectives, ArgumentErrorsAreStatuses) {
  Communicator& c = World();
  Status s = c.Broadcast(nullptr, 0, DType::kF32, c.size()).Wait();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
  s = c.AllReduce(nullptr, nullptr, 4, DType::kF32, ReduceOp::kSum).Wait();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
  // The communicator still works after argument errors.
  EXPECT_TRUE(c.Barrier().Wait().ok());
}

TEST(SubCommunicators, SplitByParity) {
  Communicator& c = World();
  const int colour = c.rank() % 2;
  auto sub = c.Split(colour, c.rank());
  ASSERT_TRUE(sub.ok()) << sub.status().ToString();
  ASSERT_NE(*sub, nullptr);
  std::vector<int> members;
  for (int r = colour; r < c.size(); r += 2) members.push_back(r);
  EXPECT_EQ((*sub)->size(), static_cast<int>(members.size()));
  EXPECT_EQ((*sub)->rank(), c.rank() / 2);
  EXPECT_EQ((*sub)->name(), c.name() + "/" + std::to_string(colour));
  for (DType d : kDTypes) {
    const size_t n = 100003;
    // Sub-rank k holds what world rank members[k] would: the expectation sums those.
    std::vector<uint8_t> buf = Input(d, c.rank(), n, 71);
    ASSERT_TRUE((*sub)->AllReduce(buf.data(), buf.data(), n, d, ReduceOp::kSum).Wait().ok());
    EXPECT_EQ(buf, Reduced(d, 0, n, 71, ReduceOp::kSum, members)) << DTypeName(d);
  }
  // Collectives on the parent still match across ranks while the child exists.
  EXPECT_TRUE(c.Barrier().Wait().ok());
}

TEST(SubCommunicators, KeyOrdersRanksAndNegativeColourJoinsNone) {
  Communicator& c = World();
  auto rev = c.Split(0, c.size() - c.rank());
  ASSERT_TRUE(rev.ok()) << rev.status().ToString();
  EXPECT_EQ((*rev)->rank(), c.size() - 1 - c.rank());
  std::vector<uint8_t> buf = Input(DType::kF32, c.rank(), 10, 3);
  ASSERT_TRUE((*rev)->Broadcast(buf.data(), 10, DType::kF32, 0).Wait().ok());
  EXPECT_EQ(buf, Input(DType::kF32, c.size() - 1, 10, 3));  // sub-rank 0 is world rank size-1

  auto none = c.Split(c.rank() == 0 ? -1 : 1, 0);
  ASSERT_TRUE(none.ok()) << none.status().ToString();
  if (c.rank() == 0) {
    EXPECT_EQ(*none, nullptr);
  } else {
    ASSERT_NE(*none, nullptr);
    EXPECT_EQ((*none)->size(), c.size() - 1);
    EXPECT_TRUE((*none)->Barrier().Wait().ok());
  }
}

}  // namespace
}  // namespace strata
