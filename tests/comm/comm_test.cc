// World size 1, without mpirun: conversions and reduction kernel, the singleton
// communicator, start-up errors, bucketing and the consistency check.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <limits>
#include <nlohmann/json.hpp>

#include "comm/dtype.h"
#include "comm/op_text.h"
#include "comm_test_util.h"
#include "strata/comm.h"
#include "strata/units.h"

namespace strata {
namespace {

using namespace comm;  // NOLINT: the conversions under test

class FinalizeMpi : public ::testing::Environment {
 public:
  void TearDown() override { EXPECT_TRUE(FinalizeWorld().ok()); }
};
const auto* const kEnv = ::testing::AddGlobalTestEnvironment(new FinalizeMpi);

std::unique_ptr<Communicator> Singleton() {
  CommOptions o;
  o.name = "single";
  auto w = InitWorld(o);
  STRATA_CHECK_MSG(w.ok(), w.status().ToString());
  return std::move(w).value();
}

TEST(Conversions, Bf16RoundsToNearestEven) {
  EXPECT_EQ(F32ToBf16(1.0f), 0x3f80);
  EXPECT_EQ(F32ToBf16(1.0f + std::ldexp(1.0f, -8)), 0x3f80);      // tie, to even
  EXPECT_EQ(F32ToBf16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3f82);  // tie, to even (up)
  EXPECT_EQ(F32ToBf16(-2.5f), 0xc020);
  EXPECT_EQ(F32ToBf16(std::numeric_limits<float>::infinity()), 0x7f80);
  EXPECT_TRUE(std::isnan(Bf16ToF32(F32ToBf16(std::numeric_limits<float>::quiet_NaN()))));
  for (uint32_t h = 0; h < 0x10000; ++h) {
    float f = Bf16ToF32(static_cast<uint16_t>(h));
    if (!std::isnan(f)) {
      ASSERT_EQ(F32ToBf16(f), h);
    }
  }
}

TEST(Conversions, Fp16ScalarReference) {
  EXPECT_EQ(F32ToF16(1.0f), 0x3c00);
  EXPECT_EQ(F32ToF16(65504.0f), 0x7bff);
  EXPECT_EQ(F32ToF16(65519.0f), 0x7bff);
  EXPECT_EQ(F32ToF16(65520.0f), 0x7c00);
  EXPECT_EQ(F32ToF16(std::ldexp(1.0f, -24)), 0x0001);
  EXPECT_EQ(F32ToF16(std::ldexp(1.0f, -25)), 0x0000);      // tie, to even
  EXPECT_EQ(F32ToF16(3 * std::ldexp(1.0f, -25)), 0x0002);  // tie, to even (up)
  EXPECT_EQ(F32ToF16(-std::ldexp(1.0f, -14)), 0x8400);
  EXPECT_EQ(F16ToF32(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(F16ToF32(0xc000), -2.0f);
  for (uint32_t h = 0; h < 0x10000; ++h) {
    float f = F16ToF32(static_cast<uint16_t>(h));
    if (!std::isnan(f)) {
      ASSERT_EQ(F32ToF16(f), h) << std::hex << h;
    }
  }
}

TEST(ReduceInto, MatchesScalarSumInOrderForEveryDType) {
  const size_t n = 3001;  // not a multiple of the kernel's block or vector width
  for (DType d : {DType::kF32, DType::kBf16, DType::kFp16}) {
    for (int divisor : {1, 3}) {
      std::vector<std::vector<uint8_t>> in;
      for (int r = 0; r < 3; ++r) in.push_back(test::Input(d, r, n, 9));
      const void* ptrs[3] = {in[0].data(), in[1].data(), in[2].data()};
      std::vector<uint8_t> out(n * DTypeSize(d));
      ReduceInto(d, 3, ptrs, out.data(), n, divisor);
      std::vector<uint8_t> want =
          test::Reduced(d, 3, n, 9, divisor == 3 ? ReduceOp::kAvg : ReduceOp::kSum);  // scalar conversions
      EXPECT_EQ(out, want) << DTypeName(d) << " divisor " << divisor;
    }
  }
}

TEST(ReduceInto, Fp16FastPathEqualsScalarOnEdgeValues) {
  std::vector<float> v = {0.0f, -0.0f, 1e-8f, std::ldexp(1.0f, -25), 6.1e-5f, 1.0f, 65504.0f, 65519.0f, 65520.0f,
                          1e6f, -3.14159f, std::numeric_limits<float>::infinity()};
  for (int i = 0; i < 1000; ++i) v.push_back(test::Value(0, static_cast<size_t>(i), 77) * 37.0f);
  // Through the kernel (F16C where the CPU has it): x + x, against the scalar reference.
  std::vector<uint16_t> in(v.size()), out(v.size());
  for (size_t i = 0; i < v.size(); ++i) in[i] = F32ToF16(v[i]);
  const void* ptrs[2] = {in.data(), in.data()};
  ReduceInto(DType::kFp16, 2, ptrs, out.data(), in.size(), 1);
  for (size_t i = 0; i < v.size(); ++i) {
    ASSERT_EQ(out[i], F32ToF16(F16ToF32(in[i]) + F16ToF32(in[i]))) << "value " << v[i];
  }
}

TEST(OpText, SameTextAsFormatBytesWithoutAllocating) {
  OpTextBuffer buf;
  EXPECT_EQ(FormatOp({"AllGather", DType::kF32, 262144}, buf), "AllGather f32 x262144 (1.00 MiB)");
  EXPECT_EQ(FormatOp({"Broadcast", DType::kBf16, 3, 1}, buf), "Broadcast bf16 x3 (6 B) root 1");
  for (uint64_t count :
       {uint64_t{0}, uint64_t{511}, uint64_t{5000}, uint64_t{123456789}, uint64_t{1} << 40}) {
    const std::string want =
        "ReduceScatter fp16 x" + std::to_string(count) + " (" + FormatBytes(count * 2) + ")";
    EXPECT_EQ(FormatOp({"ReduceScatter", DType::kFp16, count}, buf), want);
  }
}

TEST(World, SizeOneRunsWithoutMpirun) {
  auto c = Singleton();
  EXPECT_EQ(c->rank(), 0);
  EXPECT_EQ(c->size(), 1);
  EXPECT_EQ(c->backend(), "mpi");
  EXPECT_EQ(c->memory_space(), MemorySpace::kHost);
  for (DType d : {DType::kF32, DType::kBf16, DType::kFp16}) {
    const size_t n = 1003;
    std::vector<uint8_t> in = test::Input(d, 0, n, 4), out(n * DTypeSize(d), 0);
    ASSERT_TRUE(c->AllGather(in.data(), out.data(), n, d).Wait().ok());
    EXPECT_EQ(out, in);
    std::fill(out.begin(), out.end(), 0);
    ASSERT_TRUE(c->ReduceScatter(in.data(), out.data(), n, d, ReduceOp::kAvg).Wait().ok());
    EXPECT_EQ(out, in);
    std::fill(out.begin(), out.end(), 0);
    ASSERT_TRUE(c->AllReduce(in.data(), out.data(), n, d, ReduceOp::kSum).Wait().ok());
    EXPECT_EQ(out, in);
    std::vector<uint8_t> same = in;
    ASSERT_TRUE(c->AllReduce(same.data(), same.data(), n, d, ReduceOp::kSum).Wait().ok());
    EXPECT_EQ(same, in);
    ASSERT_TRUE(c->Broadcast(same.data(), n, d, 0).Wait().ok());
    EXPECT_EQ(same, in);
  }
  EXPECT_TRUE(c->Barrier().Wait().ok());
  EXPECT_EQ(c->Broadcast(nullptr, 0, DType::kF32, 1).Wait().code(), StatusCode::kInvalidArgument);
  auto sub = c->Split(5, 0);
  ASSERT_TRUE(sub.ok()) << sub.status().ToString();
  EXPECT_EQ((*sub)->size(), 1);
  EXPECT_EQ((*sub)->name(), "single/5");
  auto none = c->Split(-1, 0);
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(*none, nullptr);
}

TEST(World, WrongWorldSizeIsAClearError) {
  CommOptions o;
  auto w = InitWorld(o, /*expected_world_size=*/4);
  ASSERT_EQ(w.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(w.status().message().find("mpirun -np 4"), std::string::npos) << w.status().ToString();
  EXPECT_NE(w.status().message().find("not started by mpirun"), std::string::npos) << w.status().ToString();
}

TEST(World, OtherLauncherWorldSizeIsAClearError) {
  setenv("WORLD_SIZE", "8", 1);
  auto w = InitWorld(CommOptions{});
  unsetenv("WORLD_SIZE");
  ASSERT_EQ(w.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(w.status().message().find("WORLD_SIZE=8"), std::string::npos) << w.status().ToString();
}

TEST(World, BadTimeoutIsRejected) {
  CommOptions o;
  o.collective_timeout_s = 0;
  EXPECT_EQ(InitWorld(o).status().code(), StatusCode::kInvalidArgument);
}

TEST(World, ConsistencyOfOneRankPasses) {
  auto c = Singleton();
  EXPECT_TRUE(CheckConsistency(*c, "config", nlohmann::json{{"a", 1}}).ok());
}

TEST(World, BucketerAtSizeOne) {
  auto c = Singleton();
  BucketOptions o;
  o.kind = CollectiveKind::kAllReduce;
  o.dtype = DType::kBf16;
  o.bucket_elements = 100;
  auto b = Bucketer::Create(*c, o);
  ASSERT_TRUE(b.ok());
  std::vector<uint8_t> x = test::Input(DType::kBf16, 0, 70, 1), y = test::Input(DType::kBf16, 0, 300, 2);
  std::vector<uint8_t> gx(x.size()), gy(y.size());
  ASSERT_TRUE((*b)->Add(x.data(), gx.data(), 70).ok());
  ASSERT_TRUE((*b)->Add(y.data(), gy.data(), 300).ok());
  ASSERT_TRUE((*b)->Finish().ok());
  EXPECT_EQ(gx, x);
  EXPECT_EQ(gy, y);
  EXPECT_EQ((*b)->collectives_launched(), 2u);
  o.bucket_elements = 0;
  EXPECT_EQ(Bucketer::Create(*c, o).status().code(), StatusCode::kInvalidArgument);
}

TEST(Nccl, UnavailableWithoutAGpuSaysWhy) {
  if (NcclAvailable()) GTEST_SKIP() << "a GPU is present: covered by nccl_gpu_test";
  auto c = Singleton();
  auto n = CreateNcclCommunicator(*c, NcclOptions{}, CommOptions{});
  ASSERT_FALSE(n.ok());
  EXPECT_EQ(n.status().code(), StatusCode::kUnavailable) << n.status().ToString();
}

}  // namespace
}  // namespace strata
