// The NCCL (device) communicator with world size 1: every collective and dtype through
// the real NCCL path (bf16/fp16 reductions through the fp32 staging kernels), splitting,
// bucketing, and the producer-stream option. Skips where there is no GPU.
#include <gtest/gtest.h>

#include "comm_test_util.h"
#include "strata/comm.h"
#if STRATA_HAVE_CUDA
#include "comm/cuda/device_copy.h"
#endif

namespace strata {
namespace {

class FinalizeMpi : public ::testing::Environment {
 public:
  void TearDown() override { EXPECT_TRUE(FinalizeWorld().ok()); }
};
const auto* const kEnv = ::testing::AddGlobalTestEnvironment(new FinalizeMpi);

// Where the device communicator cannot be made (no NCCL in this build, no GPU), it
// refuses with Unavailable and says which; the tests below need it and skip.
TEST(NcclBuild, RefusesWithTheReasonWhereUnavailable) {
  if (NcclAvailable()) return;  // NCCL and a GPU: NcclTest exercises the real thing
  auto w = InitWorld(CommOptions{});
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  CommOptions o;
  o.name = "nccl-test";
  auto d = CreateNcclCommunicator(**w, NcclOptions{}, o);
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.status().code(), StatusCode::kUnavailable) << d.status().ToString();
  const std::string& m = d.status().message();
  EXPECT_TRUE(m.find("built without NCCL") != std::string::npos ||
              m.find("built without CUDA/NCCL") != std::string::npos ||
              m.find("no CUDA device") != std::string::npos)
      << m;
}

#if STRATA_HAVE_CUDA
class NcclTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!NcclAvailable()) {
      GTEST_SKIP()
          << "no GPU visible, or built without NCCL (NcclBuild says which): device collectives not tested";
    }
    auto w = InitWorld(CommOptions{});
    ASSERT_TRUE(w.ok()) << w.status().ToString();
    host_ = std::move(w).value();
    CommOptions o;
    o.name = "nccl-test";
    o.collective_timeout_s = 30;
    auto d = CreateNcclCommunicator(*host_, NcclOptions{}, o);
    ASSERT_TRUE(d.ok()) << d.status().ToString();
    dev_ = std::move(d).value();
  }
  void TearDown() override {
    for (void* p : bufs_) dev_->FreeBuffer(p);
    dev_.reset();
    host_.reset();
  }
  void* Upload(const std::vector<uint8_t>& h, size_t bytes = 0) {
    auto p = dev_->AllocateBuffer(std::max(bytes, h.size()));
    EXPECT_TRUE(p.ok()) << p.status().ToString();
    bufs_.push_back(*p);
    EXPECT_TRUE(comm::DeviceCopy(*p, h.data(), h.size()).ok());
    return *p;
  }
  std::vector<uint8_t> Download(const void* d, size_t bytes) {
    std::vector<uint8_t> h(bytes);
    EXPECT_TRUE(comm::DeviceCopy(h.data(), d, bytes).ok());
    return h;
  }
  std::unique_ptr<Communicator> host_, dev_;
  std::vector<void*> bufs_;
};

TEST_F(NcclTest, ReportsItself) {
  EXPECT_EQ(dev_->backend(), "nccl");
  EXPECT_EQ(dev_->memory_space(), MemorySpace::kDevice);
  EXPECT_EQ(dev_->size(), host_->size());
  EXPECT_EQ(dev_->rank(), host_->rank());
}

TEST_F(NcclTest, EveryOpAndDTypeMatchesTheExpectation) {
  ASSERT_EQ(dev_->size(), 1) << "this test is written for world size 1";
  for (DType d : {DType::kF32, DType::kBf16, DType::kFp16}) {
    for (size_t n : {size_t{1}, size_t{1001}, size_t{3} << 20}) {
      const size_t bytes = n * DTypeSize(d);
      std::vector<uint8_t> in = comm::test::Input(d, 0, n, 3);
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg}) {
        void* s = Upload(in);
        void* r = Upload(std::vector<uint8_t>(bytes, 0));
        ASSERT_TRUE(dev_->AllReduce(s, r, n, d, op).Wait().ok());
        EXPECT_EQ(Download(r, bytes), comm::test::Reduced(d, 1, n, 3, op)) << "AllReduce " << DTypeName(d);
        ASSERT_TRUE(dev_->ReduceScatter(s, r, n, d, op).Wait().ok());
        EXPECT_EQ(Download(r, bytes), comm::test::Reduced(d, 1, n, 3, op))
            << "ReduceScatter " << DTypeName(d);
      }
      void* s = Upload(in);
      void* r = Upload(std::vector<uint8_t>(bytes, 0));
      ASSERT_TRUE(dev_->AllGather(s, r, n, d).Wait().ok());
      EXPECT_EQ(Download(r, bytes), in);
      ASSERT_TRUE(dev_->Broadcast(s, n, d, 0).Wait().ok());
      EXPECT_EQ(Download(s, bytes), in);
    }
  }
  EXPECT_TRUE(dev_->Barrier().Wait().ok());
  EXPECT_EQ(dev_->Broadcast(nullptr, 0, DType::kF32, 3).Wait().code(), StatusCode::kInvalidArgument);
}

TEST_F(NcclTest, SplitAndBucketing) {
  auto sub = dev_->Split(0, 0);
  ASSERT_TRUE(sub.ok()) << sub.status().ToString();
  ASSERT_NE(*sub, nullptr);
  EXPECT_EQ((*sub)->backend(), "nccl");
  BucketOptions o;
  o.kind = CollectiveKind::kAllReduce;
  o.dtype = DType::kBf16;
  o.bucket_elements = 1000;
  auto b = Bucketer::Create(**sub, o);
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  std::vector<std::vector<uint8_t>> ins;
  std::vector<void*> s, r;
  for (size_t n : {size_t{10}, size_t{700}, size_t{5000}, size_t{3}}) {
    ins.push_back(comm::test::Input(DType::kBf16, 0, n, 8));
    s.push_back(Upload(ins.back()));
    r.push_back(Upload(std::vector<uint8_t>(n * 2, 0)));
    ASSERT_TRUE((*b)->Add(s.back(), r.back(), n).ok());
  }
  ASSERT_TRUE((*b)->Finish().ok());
  for (size_t i = 0; i < ins.size(); ++i) EXPECT_EQ(Download(r[i], ins[i].size()), ins[i]) << "tensor " << i;
  b->reset();
}
#endif

}  // namespace
}  // namespace strata
