// MemoryOptimizer on the host tier: in-place and speculative steps against the plain
// CPU Adam (AdamOnHost), and how Commit and Discard move the state and spare buffers.
#include "zero/memory_optimizer.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "zero/device_ops.h"
#include "zero/save_gate.h"

namespace strata::zero {
namespace {

constexpr int64_t kElems = 1000;
constexpr int kChunks = 3;

AdamParams Params() {
  AdamParams p;
  p.lr = 1e-2f;
  p.weight_decay = 0.01f;
  p.step = 3;
  p.grad_scale = 0.5f;
  return p;
}

// master | m | v with v >= 0, as a few steps of Adam would leave them.
std::vector<float> RandomState(uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> st(3 * kElems);
  for (int64_t i = 0; i < 2 * kElems; ++i) st[i] = normal(rng);
  for (int64_t i = 2 * kElems; i < 3 * kElems; ++i) st[i] = std::abs(normal(rng)) * 1e-2f;
  return st;
}

std::vector<float> RandomGrad(uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> g(kElems);
  for (float& x : g) x = normal(rng);
  return g;
}

template <typename A, typename B>
bool SameBits(const A& a, const B& b) {
  return a.size() * sizeof(a[0]) == b.size() * sizeof(b[0]) &&
         std::memcmp(a.data(), b.data(), a.size() * sizeof(a[0])) == 0;
}

class MemoryOptimizerTest : public ::testing::TestWithParam<DType> {
 protected:
  void SetUp() override {
    for (int c = 0; c < kChunks; ++c) {
      state_[c] = RandomState(10 + c);
      grad_[c] = RandomGrad(20 + c);
      opt_.SetState(c, state_[c].data());
    }
  }
  void AddSpares(int n) {
    spares_.resize(n, std::vector<float>(3 * kElems, -7.0f));
    for (auto& s : spares_) opt_.AddSpare(s.data());
  }
  OptimizerStep At(int chunk, bool speculative) {
    OptimizerStep s;
    s.chunk = chunk;
    s.adam = Params();
    s.compute = GetParam();
    s.speculative = speculative;
    s.epoch = 1;
    return s;
  }
  std::vector<uint8_t> OutBuffer() { return std::vector<uint8_t>(kElems * DTypeSize(GetParam()), 0xAB); }
  // The reference: AdamOnHost on a copy of the chunk's state as it is now.
  void Reference(int chunk, std::vector<float>* st, std::vector<uint8_t>* out) {
    st->assign(opt_.state(chunk), opt_.state(chunk) + 3 * kElems);
    *out = OutBuffer();
    ASSERT_TRUE(
        AdamOnHost(Params(), st->data(), kElems, grad_[chunk].data(), GetParam(), out->data(), nullptr).ok());
  }
  std::vector<float> State(int chunk) { return {opt_.state(chunk), opt_.state(chunk) + 3 * kElems}; }

  SaveGate gate_;
  MemoryOptimizer opt_{ZeroTier::kHost, &HostMemoryOps(), kElems, kChunks, &gate_};
  std::vector<float> state_[kChunks];
  std::vector<float> grad_[kChunks];
  std::vector<std::vector<float>> spares_;
};

TEST_P(MemoryOptimizerTest, StepInPlaceIsAdamOnHost) {
  for (int c = 0; c < kChunks; ++c) {
    std::vector<float> want;
    std::vector<uint8_t> want_out;
    Reference(c, &want, &want_out);
    std::vector<uint8_t> out = OutBuffer();
    auto stepped = opt_.Step(At(c, false), grad_[c].data(), out.data());
    ASSERT_TRUE(stepped.ok()) << stepped.status().ToString();
    EXPECT_TRUE(*stepped);
    EXPECT_EQ(opt_.state(c), state_[c].data()) << "stepped in place";
    EXPECT_TRUE(SameBits(State(c), want)) << "chunk " << c;
    EXPECT_TRUE(SameBits(out, want_out)) << "chunk " << c;
    opt_.Commit(c, 1);  // nothing pending: the state stays where it is
    EXPECT_EQ(opt_.state(c), state_[c].data());
  }
}

TEST_P(MemoryOptimizerTest, SpeculativeStepShowsOnlyOnCommit) {
  AddSpares(1);
  const std::vector<float> before = State(0);
  std::vector<float> want;
  std::vector<uint8_t> want_out;
  Reference(0, &want, &want_out);

  std::vector<uint8_t> out = OutBuffer();
  auto stepped = opt_.Step(At(0, true), grad_[0].data(), out.data());
  ASSERT_TRUE(stepped.ok()) << stepped.status().ToString();
  ASSERT_TRUE(*stepped);
  EXPECT_TRUE(SameBits(out, want_out));
  EXPECT_TRUE(SameBits(State(0), before)) << "the committed state changed before Commit";
  EXPECT_FALSE(opt_.HasSpare());

  opt_.Commit(0, 1);
  EXPECT_EQ(opt_.state(0), spares_[0].data());
  EXPECT_TRUE(SameBits(State(0), want));
  ASSERT_TRUE(opt_.HasSpare()) << "the old state buffer is a spare again";

  // The one spare is now chunk 0's old buffer: chunk 1 speculates into it.
  Reference(1, &want, &want_out);
  stepped = opt_.Step(At(1, true), grad_[1].data(), out.data());
  ASSERT_TRUE(stepped.ok() && *stepped);
  EXPECT_TRUE(SameBits(out, want_out));
  opt_.Commit(1, 1);
  EXPECT_EQ(opt_.state(1), state_[0].data());
  EXPECT_TRUE(SameBits(State(1), want));
}

TEST_P(MemoryOptimizerTest, DiscardKeepsTheCommittedStateAndFreesTheSpare) {
  AddSpares(1);
  const std::vector<float> before = State(2);
  std::vector<uint8_t> out = OutBuffer();
  auto stepped = opt_.Step(At(2, true), grad_[2].data(), out.data());
  ASSERT_TRUE(stepped.ok() && *stepped);
  opt_.Discard(2);
  EXPECT_EQ(opt_.state(2), state_[2].data());
  EXPECT_TRUE(SameBits(State(2), before));
  EXPECT_TRUE(opt_.HasSpare());
  // A Commit after Discard has nothing to make current.
  opt_.Commit(2, 1);
  EXPECT_EQ(opt_.state(2), state_[2].data());
  EXPECT_TRUE(SameBits(State(2), before));

  // The step redone in place starts from the committed state, not the discarded one.
  std::vector<float> want;
  std::vector<uint8_t> want_out;
  Reference(2, &want, &want_out);
  stepped = opt_.Step(At(2, false), grad_[2].data(), out.data());
  ASSERT_TRUE(stepped.ok() && *stepped);
  EXPECT_TRUE(SameBits(State(2), want));
  EXPECT_TRUE(SameBits(out, want_out));
}

TEST_P(MemoryOptimizerTest, SpeculativeStepWithoutSpareDoesNothing) {
  EXPECT_FALSE(opt_.HasSpare());
  const std::vector<float> before = State(1);
  std::vector<uint8_t> out = OutBuffer();
  const std::vector<uint8_t> untouched = out;
  auto stepped = opt_.Step(At(1, true), grad_[1].data(), out.data());
  ASSERT_TRUE(stepped.ok()) << stepped.status().ToString();
  EXPECT_FALSE(*stepped);
  EXPECT_TRUE(SameBits(out, untouched));
  EXPECT_TRUE(SameBits(State(1), before));
  EXPECT_EQ(opt_.state(1), state_[1].data());

  // With one spare held by a pending step, a second speculation finds none either.
  AddSpares(1);
  EXPECT_TRUE(opt_.HasSpare());
  ASSERT_TRUE(*opt_.Step(At(0, true), grad_[0].data(), out.data()));
  EXPECT_FALSE(opt_.HasSpare());
  auto second = opt_.Step(At(1, true), grad_[1].data(), out.data());
  ASSERT_TRUE(second.ok());
  EXPECT_FALSE(*second);
  EXPECT_TRUE(SameBits(State(1), before));
}

TEST_P(MemoryOptimizerTest, ReadMasterReadsTheCommittedMaster) {
  AddSpares(1);
  std::vector<float> master(kElems, -1.0f);
  ASSERT_TRUE(opt_.ReadMaster(0, master.data()).ok());
  EXPECT_TRUE(SameBits(master, std::vector<float>(state_[0].begin(), state_[0].begin() + kElems)));

  std::vector<uint8_t> out = OutBuffer();
  ASSERT_TRUE(*opt_.Step(At(0, true), grad_[0].data(), out.data()));
  ASSERT_TRUE(opt_.ReadMaster(0, master.data()).ok());
  EXPECT_TRUE(SameBits(master, std::vector<float>(state_[0].begin(), state_[0].begin() + kElems)))
      << "a pending result is not the master yet";
  opt_.Commit(0, 1);
  ASSERT_TRUE(opt_.ReadMaster(0, master.data()).ok());
  EXPECT_TRUE(SameBits(master, std::vector<float>(spares_[0].begin(), spares_[0].begin() + kElems)));
}

INSTANTIATE_TEST_SUITE_P(Compute, MemoryOptimizerTest, ::testing::Values(DType::kF32, DType::kBf16),
                         [](const ::testing::TestParamInfo<DType>& info) {
                           return std::string(DTypeName(info.param));
                         });

}  // namespace
}  // namespace strata::zero
