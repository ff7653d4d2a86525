// Every CPU Adam path (each ISA this CPU has, via the explicit-ISA entry point and the
// STRATA_ADAM_ISA-equivalent SelectCpuIsa) against the double-precision reference.
// Tolerances: see adam_test_util.h.
#include <oneapi/tbb/task_arena.h>

#include <algorithm>
#include <fstream>
#include <iterator>
#include <set>
#include <sstream>
#include <tuple>

#include "adam_test_util.h"
#include "strata/cpu_isa.h"

namespace strata {
namespace {

using testing::AdamState;
using testing::Magnitude;

AdamParams Params(bool adamw, int64_t step) {
  AdamParams a;
  a.lr = 1e-3f;
  a.beta1 = 0.9f;
  a.beta2 = 0.999f;
  a.eps = 1e-8f;
  a.weight_decay = 0.01f;
  a.adamw = adamw;
  a.step = step;
  return a;
}

// One step of `isa` and of the reference from the same state; checks m, v, p within the
// derived tolerance and the 16-bit copy bit for bit.
void CheckOneStep(CpuIsa isa, const AdamParams& a, AdamState& fast, DType gt, bool copy, DType ot,
                  tbb::task_arena* arena) {
  AdamState ref = fast;
  const testing::Tolerance tol = testing::StepTolerance(a, fast, gt);
  ASSERT_TRUE(
      AdamStepWithIsa(isa, a, fast.P(), fast.M(), fast.V(), fast.Grad(gt), fast.n, fast.Out(copy, ot), arena)
          .ok());
  ASSERT_TRUE(AdamStepReference(a, ref.P(), ref.M(), ref.V(), ref.Grad(gt), ref.n, ref.Out(copy, ot)).ok());
  EXPECT_TRUE(testing::Near("m", fast.M(), ref.M(), tol.m, fast.n));
  EXPECT_TRUE(testing::Near("v", fast.V(), ref.V(), tol.v, fast.n));
  EXPECT_TRUE(testing::Near("p", fast.P(), ref.P(), tol.p, fast.n));
  if (copy) {
    EXPECT_TRUE(testing::CopyExact(fast, ot));
  }
  // Untouched: the element before a misaligned start.
  if (fast.off > 0) {
    EXPECT_EQ(fast.out16[0], 0xdead);
  }
}

class AdamIsaTest : public ::testing::TestWithParam<CpuIsa> {};

TEST_P(AdamIsaTest, SizesGradTypesCopiesModes) {
  const CpuIsa isa = GetParam();
  for (size_t n :
       {size_t{0}, size_t{1}, size_t{7}, size_t{15}, size_t{16}, size_t{17}, size_t{33}, size_t{100}}) {
    for (DType gt : {DType::kF32, DType::kBf16, DType::kFp16}) {
      for (int copy = 0; copy < 3; ++copy) {
        for (bool adamw : {true, false}) {
          for (size_t off : {size_t{0}, size_t{1}}) {
            SCOPED_TRACE(::testing::Message() << "n=" << n << " grad=" << DTypeName(gt) << " copy=" << copy
                                              << " adamw=" << adamw << " off=" << off);
            AdamState s = testing::MakeState(n, off, Magnitude::kNormal, n * 131 + off);
            AdamParams a = Params(adamw, 3);
            if (gt != DType::kF32) {
              a.grad_scale = 1.0f / 1024;
              testing::Make16BitGrads(s, gt, 1024.0f);
            }
            CheckOneStep(isa, a, s, gt, copy != 0, copy == 2 ? DType::kFp16 : DType::kBf16, nullptr);
          }
        }
      }
    }
  }
}

TEST_P(AdamIsaTest, Magnitudes) {
  const CpuIsa isa = GetParam();
  for (Magnitude mag : {Magnitude::kNormal, Magnitude::kLarge, Magnitude::kTiny, Magnitude::kZero,
                        Magnitude::kSubnormalParams}) {
    for (DType ot : {DType::kBf16, DType::kFp16}) {
      for (bool adamw : {true, false}) {
        SCOPED_TRACE(::testing::Message()
                     << testing::MagnitudeName(mag) << " out=" << DTypeName(ot) << " adamw=" << adamw);
        AdamState s = testing::MakeState(1000, 3, mag, 7);
        CheckOneStep(isa, Params(adamw, 1), s, DType::kF32, true, ot, nullptr);
      }
    }
  }
}

TEST_P(AdamIsaTest, LargeTensorManyThreadsMisaligned) {
  const CpuIsa isa = GetParam();
  tbb::task_arena arena(2);
  for (DType gt : {DType::kF32, DType::kBf16}) {
    SCOPED_TRACE(DTypeName(gt));
    AdamState s = testing::MakeState((size_t{1} << 20) + 3, 1, Magnitude::kNormal, 99);
    AdamParams a = Params(true, 10);
    if (gt != DType::kF32) testing::Make16BitGrads(s, gt, 1.0f);
    CheckOneStep(isa, a, s, gt, true, DType::kBf16, &arena);
  }
}

// 100 consecutive steps. Each step is checked from the same state against the
// reference (per-step bound), and the two independent trajectories are checked for
// drift with bounds accumulated by the error recurrences of adam_test_util.h:
//   Em_t = b1 Em_{t-1} + tol_m(t),  Ev_t = b2 Ev_{t-1} + tol_v(t),
//   Ep_t = decay Ep_{t-1} + tol_p(t) + (s_t Em_t + U_t c2 sqrt(Ev_t)) / d_t,  d_t = c2 sqrt(v_t) + eps
// (AdamW: m and v do not depend on p, so errors only contract or add up).
TEST_P(AdamIsaTest, HundredStepsDrift) {
  const CpuIsa isa = GetParam();
  const size_t n = 4099;
  AdamState fast = testing::MakeState(n, 0, Magnitude::kNormal, 5);
  AdamState ref = fast;
  std::vector<double> em(n, 0), ev(n, 0), ep(n, 0);
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (int64_t step = 1; step <= 100; ++step) {
    for (size_t i = 0; i < n; ++i) fast.g32[i] = ref.g32[i] = u(rng);
    const AdamParams a = Params(true, step);
    // Per-step check from the fast path's current state.
    AdamState probe = fast;
    CheckOneStep(isa, a, probe, DType::kF32, true, DType::kBf16, nullptr);
    // Independent trajectories.
    const testing::Tolerance tol = testing::StepTolerance(a, ref, DType::kF32);
    ASSERT_TRUE(AdamStepWithIsa(isa, a, fast.P(), fast.M(), fast.V(), fast.Grad(DType::kF32), n, {}).ok());
    ASSERT_TRUE(AdamStepReference(a, ref.P(), ref.M(), ref.V(), ref.Grad(DType::kF32), n, {}).ok());
    const double bc1 = 1 - std::pow(double(a.beta1), double(step));
    const double bc2 = 1 - std::pow(double(a.beta2), double(step));
    const double s = a.lr / bc1, c2 = 1 / std::sqrt(bc2), decay = 1 - double(a.lr) * a.weight_decay;
    for (size_t i = 0; i < n; ++i) {
      em[i] = a.beta1 * em[i] + tol.m[i];
      ev[i] = a.beta2 * ev[i] + tol.v[i];
      const double U = s * std::fabs(ref.m[i]) / (std::sqrt(ref.v[i]) * c2 + a.eps);
      ep[i] = decay * ep[i] + tol.p[i] + s * em[i] / (std::sqrt(ref.v[i]) * c2 + a.eps) +
              U * c2 * std::sqrt(ev[i]) / (std::sqrt(ref.v[i]) * c2 + a.eps);
    }
    ASSERT_TRUE(testing::Near("m drift", fast.M(), ref.M(), em, n)) << "step " << step;
    ASSERT_TRUE(testing::Near("v drift", fast.V(), ref.V(), ev, n)) << "step " << step;
    ASSERT_TRUE(testing::Near("p drift", fast.P(), ref.P(), ep, n)) << "step " << step;
  }
}

TEST_P(AdamIsaTest, MultiTensorPerGroupParams) {
  const CpuIsa isa = GetParam();
  ASSERT_TRUE(SelectCpuIsa(isa).ok());
  AdamParams g1 = Params(true, 5), g2 = Params(false, 1);
  g2.lr = 3e-4f;
  g2.beta1 = 0.8f;
  g2.bias_correction = false;
  AdamParams g3 = Params(true, 1000);
  g3.grad_scale = 0.5f;
  const AdamParams* groups[] = {&g1, &g2, &g3, &g1};
  const size_t sizes[] = {70000, 17, 0, 40001};
  std::vector<AdamState> fast, ref;
  std::vector<AdamTensor> tensors;
  for (int i = 0; i < 4; ++i)
    fast.push_back(testing::MakeState(sizes[i], i % 2, Magnitude::kNormal, 100 + i));
  ref = fast;
  for (int i = 0; i < 4; ++i) {
    tensors.push_back({groups[i], fast[i].P(), fast[i].M(), fast[i].V(), fast[i].Grad(DType::kF32),
                       fast[i].Out(true, DType::kBf16), sizes[i]});
  }
  std::vector<testing::Tolerance> tol;
  for (int i = 0; i < 4; ++i) tol.push_back(testing::StepTolerance(*groups[i], ref[i], DType::kF32));
  tbb::task_arena arena(2);
  ASSERT_TRUE(AdamStep(tensors, &arena).ok());
  for (int i = 0; i < 4; ++i) {
    SCOPED_TRACE(i);
    ASSERT_TRUE(AdamStepReference(*groups[i], ref[i].P(), ref[i].M(), ref[i].V(), ref[i].Grad(DType::kF32),
                                  sizes[i], ref[i].Out(true, DType::kBf16))
                    .ok());
    EXPECT_TRUE(testing::Near("m", fast[i].M(), ref[i].M(), tol[i].m, sizes[i]));
    EXPECT_TRUE(testing::Near("v", fast[i].V(), ref[i].V(), tol[i].v, sizes[i]));
    EXPECT_TRUE(testing::Near("p", fast[i].P(), ref[i].P(), tol[i].p, sizes[i]));
    EXPECT_TRUE(testing::CopyExact(fast[i], DType::kBf16));
  }
  ResetCpuIsa();
}

std::string IsaParamName(const ::testing::TestParamInfo<CpuIsa>& info) {
  return std::string(CpuIsaName(info.param));
}

INSTANTIATE_TEST_SUITE_P(AllSupported, AdamIsaTest, ::testing::ValuesIn(SupportedCpuIsas()), IsaParamName);

TEST(AdamTest, TheFastPathsAreNotTheReference) {
  // Guards the tests above against comparing a path with itself: fp32 single rounding
  // chains differ from the double reference in some element of a large random tensor.
  const size_t n = 4096;
  AdamState a = testing::MakeState(n, 0, Magnitude::kNormal, 1), b = a;
  const AdamParams p = Params(true, 2);
  ASSERT_TRUE(AdamStepWithIsa(BestCpuIsa(), p, a.P(), a.M(), a.V(), a.Grad(DType::kF32), n).ok());
  ASSERT_TRUE(AdamStepReference(p, b.P(), b.M(), b.V(), b.Grad(DType::kF32), n).ok());
  EXPECT_NE(0, std::memcmp(a.P(), b.P(), n * 4));
}

TEST(AdamTest, DetectsAWrongUpdate) {
  // The tolerance is tight enough to catch a wrong formula: dropping bias correction on
  // the second moment at step 1 changes p by far more than a few ulps.
  AdamState s = testing::MakeState(64, 0, Magnitude::kNormal, 3);
  AdamState ref = s;
  AdamParams a = Params(true, 1);
  const testing::Tolerance tol = testing::StepTolerance(a, s, DType::kF32);
  ASSERT_TRUE(AdamStep(a, s.P(), s.M(), s.V(), s.Grad(DType::kF32), s.n).ok());
  a.bias_correction = false;
  ASSERT_TRUE(AdamStepReference(a, ref.P(), ref.M(), ref.V(), ref.Grad(DType::kF32), ref.n).ok());
  EXPECT_FALSE(testing::Near("p", s.P(), ref.P(), tol.p, s.n));
}

TEST(AdamTest, RejectsBadArguments) {
  float x = 0;
  AdamParams a = Params(true, 0);
  EXPECT_EQ(AdamStep(a, &x, &x, &x, {&x, DType::kF32}, 1).code(), StatusCode::kInvalidArgument);
  a.step = 1;
  a.beta2 = 1.0f;
  EXPECT_EQ(AdamStep(a, &x, &x, &x, {&x, DType::kF32}, 1).code(), StatusCode::kInvalidArgument);
  a.beta2 = 0.999f;
  EXPECT_EQ(AdamStep(a, nullptr, &x, &x, {&x, DType::kF32}, 1).code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(AdamStep(a, nullptr, nullptr, nullptr, {}, 0).ok());
  EXPECT_EQ(AdamStep(a, &x, &x, &x, {&x, DType::kF32}, 1, {&x, DType::kF32}).code(),
            StatusCode::kInvalidArgument);
  a.lr = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(AdamStep(a, &x, &x, &x, {&x, DType::kF32}, 1).code(), StatusCode::kInvalidArgument);
  AdamTensor t{nullptr, &x, &x, &x, {&x, DType::kF32}, {}, 1};
  EXPECT_EQ(AdamStep(std::span<const AdamTensor>(&t, 1)).code(), StatusCode::kInvalidArgument);
}

TEST(AdamTest, UnsupportedIsaIsAnError) {
  int unsupported = 0;
  for (CpuIsa isa : {CpuIsa::kAvx2, CpuIsa::kAvx512, CpuIsa::kAvx512Bf16}) {
    if (CpuSupports(isa)) continue;
    ++unsupported;
    float x = 0;
    EXPECT_EQ(AdamStepWithIsa(isa, Params(true, 1), &x, &x, &x, {&x, DType::kF32}, 1).code(),
              StatusCode::kUnavailable);
    EXPECT_EQ(SelectCpuIsa(isa).code(), StatusCode::kUnavailable);
  }
  EXPECT_TRUE(CpuSupports(CpuIsa::kScalar));
  if (unsupported == 0) GTEST_SKIP() << "this CPU has every ISA: the refusal of a missing one is not exercised here";
}

// The flags the kernels' compile options need (src/CMakeLists.txt), as the kernel reports them.
std::set<std::string> CpuinfoFlags() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("flags", 0) != 0) continue;
    std::istringstream words(line.substr(line.find(':') + 1));
    return {std::istream_iterator<std::string>(words), std::istream_iterator<std::string>()};
  }
  return {};
}

TEST(AdamTest, SupportedIsasMatchTheKernelsCpuFlags) {
  const std::set<std::string> f = CpuinfoFlags();
  if (f.empty()) GTEST_SKIP() << "no flags line in /proc/cpuinfo";
  auto has = [&](std::initializer_list<const char*> names) {
    for (const char* n : names) {
      if (!f.count(n)) return false;
    }
    return true;
  };
  const bool avx2 = has({"avx2", "fma", "f16c"});
  const bool avx512 = avx2 && has({"avx512f", "avx512bw", "avx512vl"});
  EXPECT_EQ(CpuSupports(CpuIsa::kAvx2), avx2);
  EXPECT_EQ(CpuSupports(CpuIsa::kAvx512), avx512);
  EXPECT_EQ(CpuSupports(CpuIsa::kAvx512Bf16), avx512 && has({"avx512_bf16"}));
  const std::vector<CpuIsa> isas = SupportedCpuIsas();
  ASSERT_FALSE(isas.empty());
  EXPECT_EQ(isas.front(), CpuIsa::kScalar);
  EXPECT_TRUE(std::is_sorted(isas.begin(), isas.end()));
  EXPECT_EQ(BestCpuIsa(), isas.back());
  for (CpuIsa isa : isas) EXPECT_TRUE(CpuSupports(isa)) << CpuIsaName(isa);
}

}  // namespace
}  // namespace strata
