// STRATA_ADAM_ISA: an unknown name or an ISA the CPU lacks is an error from every call,
// never a silent fallback. Its own executable, because the variable is read once.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "strata/adam.h"
#include "strata/cpu_isa.h"
#include "strata/grad_stats.h"

namespace strata {
namespace {

TEST(CpuIsaEnvTest, UnknownNameIsAnErrorEverywhereUntilSelected) {
  ASSERT_EQ(setenv("STRATA_ADAM_ISA", "avx9000", 1), 0);
  Result<CpuIsa> isa = ActiveCpuIsa();
  ASSERT_FALSE(isa.ok());
  EXPECT_EQ(isa.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(isa.status().message().find("STRATA_ADAM_ISA=avx9000"), std::string::npos);
  EXPECT_NE(isa.status().message().find("scalar"), std::string::npos);  // lists the choices
  float x = 1;
  EXPECT_EQ(AdamStep(AdamParams{}, &x, &x, &x, {&x, DType::kF32}, 1).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(x, 1);  // untouched
  EXPECT_EQ(ComputeGradStats({&x, DType::kF32}, 1).status().code(), StatusCode::kInvalidArgument);
  // An explicit choice wins over the variable.
  ASSERT_TRUE(SelectCpuIsa(CpuIsa::kScalar).ok());
  EXPECT_TRUE(AdamStep(AdamParams{}, &x, &x, &x, {&x, DType::kF32}, 1).ok());
  ResetCpuIsa();
  EXPECT_FALSE(ActiveCpuIsa().ok());
}

TEST(CpuIsaEnvTest, NamesRoundTrip) {
  for (CpuIsa isa : {CpuIsa::kScalar, CpuIsa::kAvx2, CpuIsa::kAvx512, CpuIsa::kAvx512Bf16}) {
    Result<CpuIsa> back = ParseCpuIsa(CpuIsaName(isa));
    ASSERT_TRUE(back.ok());
    EXPECT_EQ(*back, isa);
  }
  EXPECT_FALSE(ParseCpuIsa("AVX2").ok());
}

}  // namespace
}  // namespace strata
