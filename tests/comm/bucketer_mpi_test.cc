// Bucketed collectives give the same bytes as one collective per tensor, with fewer
// collectives, across ranks.
#include <gtest/gtest.h>

#include "comm_test_util.h"
#include "strata/comm.h"

namespace strata {
namespace {

using comm::test::Input;

Communicator& World() {
  static std::unique_ptr<Communicator> world = [] {
    CommOptions o;
    o.name = "bucketer-test";
    o.collective_timeout_s = 60;
    auto w = InitWorld(o);
    STRATA_CHECK_MSG(w.ok(), w.status().ToString());
    return std::move(w).value();
  }();
  return *world;
}

// Many small tensors, some empty, one bigger than a bucket (runs on its own).
const std::vector<size_t> kSizes = {3, 1, 100, 0, 257, 64, 4000, 5, 999, 20000, 7, 128, 33, 2048, 1};

void RoundTrip(CollectiveKind kind, DType d, ReduceOp op, size_t bucket_elements, int max_in_flight) {
  Communicator& c = World();
  const size_t p = static_cast<size_t>(c.size());
  const size_t ds = DTypeSize(d);
  auto in_count = [&](size_t n) { return kind == CollectiveKind::kReduceScatter ? n * p : n; };
  auto out_count = [&](size_t n) { return kind == CollectiveKind::kAllGather ? n * p : n; };
  std::vector<std::vector<uint8_t>> send, got, want;
  for (size_t i = 0; i < kSizes.size(); ++i) {
    send.push_back(Input(d, c.rank(), in_count(kSizes[i]), 1000 + static_cast<uint32_t>(i)));
    got.emplace_back(out_count(kSizes[i]) * ds, 0xEE);
    want.emplace_back(out_count(kSizes[i]) * ds, 0xEE);
  }
  // Reference: one plain collective per tensor.
  for (size_t i = 0; i < kSizes.size(); ++i) {
    CommHandle h;
    switch (kind) {
      case CollectiveKind::kAllGather: h = c.AllGather(send[i].data(), want[i].data(), kSizes[i], d); break;
      case CollectiveKind::kReduceScatter:
        h = c.ReduceScatter(send[i].data(), want[i].data(), kSizes[i], d, op);
        break;
      case CollectiveKind::kAllReduce: h = c.AllReduce(send[i].data(), want[i].data(), kSizes[i], d, op); break;
    }
    ASSERT_TRUE(h.Wait().ok());
  }
  BucketOptions o;
  o.kind = kind;
  o.dtype = d;
  o.op = op;
  o.bucket_elements = bucket_elements;
  o.max_in_flight = max_in_flight;
  auto b = Bucketer::Create(c, o);
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  for (int round = 0; round < 2; ++round) {  // reusable after Finish
    for (auto& g : got) std::fill(g.begin(), g.end(), 0xEE);
    for (size_t i = 0; i < kSizes.size(); ++i) ASSERT_TRUE((*b)->Add(send[i].data(), got[i].data(), kSizes[i]).ok());
    ASSERT_TRUE((*b)->Finish().ok());
    for (size_t i = 0; i < kSizes.size(); ++i) {
      ASSERT_EQ(got[i], want[i]) << CollectiveKindName(kind) << " " << DTypeName(d) << " tensor " << i << " (n="
                                 << kSizes[i] << ") bucket " << bucket_elements << " round " << round;
    }
  }
  // Bucketing coalesced: two rounds took fewer collectives than one round has tensors.
  EXPECT_LE((*b)->collectives_launched(), kSizes.size() - 1);  // two rounds, 14 tensors each
}

TEST(Bucketer, AllReduceRoundTrips) {
  for (DType d : {DType::kF32, DType::kBf16}) {
    RoundTrip(CollectiveKind::kAllReduce, d, ReduceOp::kSum, 8192, 2);
    RoundTrip(CollectiveKind::kAllReduce, d, ReduceOp::kAvg, 5000, 1);
  }
}

TEST(Bucketer, ReduceScatterRoundTrips) {
  const size_t p = static_cast<size_t>(World().size());
  for (DType d : {DType::kF32, DType::kFp16}) {
    RoundTrip(CollectiveKind::kReduceScatter, d, ReduceOp::kSum, 8192 * p, 2);
    RoundTrip(CollectiveKind::kReduceScatter, d, ReduceOp::kAvg, 3000 * p, 3);
  }
}

TEST(Bucketer, AllGatherRoundTrips) {
  const size_t p = static_cast<size_t>(World().size());
  for (DType d : {DType::kF32, DType::kBf16}) {
    RoundTrip(CollectiveKind::kAllGather, d, ReduceOp::kSum, 8192 * p, 2);
    RoundTrip(CollectiveKind::kAllGather, d, ReduceOp::kSum, 4001 * p, 1);
  }
}

}  // namespace
}  // namespace strata
