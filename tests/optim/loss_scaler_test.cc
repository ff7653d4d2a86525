// LossScaler against traces derived from DeepSpeed's DynamicLossScaler.update_scale
// (deepspeed/runtime/fp16/loss_scaler.py, deepspeedai/DeepSpeed 18fd4c97, and the
// earlier window rule), computed by a line-by-line Python transliteration of that
// method with init_scale 16, scale_window 3, min_scale 2, delayed_shift (hysteresis) 2,
// over the overflow pattern below. Each entry is "scale/hysteresis" after the update;
// ERR is where DeepSpeed raises (overflow at the minimum scale).
#include "strata/loss_scaler.h"

#include <gtest/gtest.h>

#include <sstream>
#include <string>
#include <vector>

namespace strata {
namespace {

constexpr const char* kPattern = "0001101000000100110000000011111";

struct TraceCase {
  bool consecutive_hysteresis;
  bool legacy;
  const char* trace;
};

const TraceCase kCases[] = {
    {false, false,
     "16/2 16/2 16/2 16/1 8/1 8/1 4/1 4/1 4/1 4/1 8/2 8/2 8/2 8/1 8/1 8/1 4/1 2/1 2/1 2/1 2/1 4/2 4/2 4/2 "
     "8/2 8/2 "
     "8/1 4/1 2/1 ERR"},
    {false, true,
     "16/2 16/2 32/2 32/1 16/1 16/1 8/1 8/1 8/1 16/2 16/2 16/2 32/2 32/1 32/1 32/1 16/1 8/1 8/1 8/1 16/2 "
     "16/2 "
     "16/2 32/2 32/2 32/2 32/1 16/1 8/1 4/1 2/1"},
    {true, false,
     "16/2 16/2 16/2 16/1 8/1 8/2 8/1 8/2 8/2 8/2 16/2 16/2 16/2 16/1 16/2 16/2 16/1 8/1 8/2 8/2 8/2 16/2 "
     "16/2 "
     "16/2 32/2 32/2 32/1 16/1 8/1 4/1 2/1"},
    {true, true,
     "16/2 16/2 32/2 32/1 16/1 16/2 16/1 16/2 16/2 32/2 32/2 32/2 64/2 64/1 64/2 64/2 64/1 32/1 32/2 32/2 "
     "64/2 "
     "64/2 64/2 128/2 128/2 128/2 128/1 64/1 32/1 16/1 8/1"},
};

TEST(LossScalerTest, MatchesDeepSpeedTraces) {
  for (const TraceCase& c : kCases) {
    SCOPED_TRACE(::testing::Message()
                 << "consecutive_hysteresis=" << c.consecutive_hysteresis << " legacy=" << c.legacy);
    LossScalerOptions o;
    o.init_scale = 16;
    o.scale_window = 3;
    o.min_scale = 2;
    o.delayed_shift = 2;
    o.consecutive_hysteresis = c.consecutive_hysteresis;
    o.legacy_window_rule = c.legacy;
    Result<LossScaler> s = LossScaler::Create(o);
    ASSERT_TRUE(s.ok());
    std::istringstream want(c.trace);
    std::string tok;
    for (const char* p = kPattern; *p != '\0'; ++p) {
      ASSERT_TRUE(want >> tok) << "trace shorter than pattern";
      const LossScaler::State before = s->state();
      Status st = s->Update(*p == '1');
      if (tok == "ERR") {
        EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition);
        EXPECT_EQ(s->state().iter, before.iter);  // unchanged, as when DeepSpeed raises
        EXPECT_EQ(s->scale(), before.scale);
        break;
      }
      ASSERT_TRUE(st.ok()) << st.ToString();
      std::ostringstream got;
      got << s->scale() << "/" << s->state().hysteresis;
      EXPECT_EQ(got.str(), tok) << "at step " << (p - kPattern);
    }
  }
}

TEST(LossScalerTest, DefaultsGrowAfterWindowAndNeverGoBelowMin) {
  LossScalerOptions o;  // 2^16, window 1000, hysteresis 2, min 1
  o.raise_error_at_min_scale = false;
  Result<LossScaler> s = LossScaler::Create(o);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->scale(), 65536);
  EXPECT_FLOAT_EQ(s->grad_scale(), 1.0f / 65536);
  for (int i = 0; i < 1000; ++i) ASSERT_TRUE(s->Update(false).ok());
  EXPECT_EQ(s->scale(), 65536);  // the current rule needs window + 1 good steps
  ASSERT_TRUE(s->Update(false).ok());
  EXPECT_EQ(s->scale(), 131072);
  for (int i = 0; i < 100; ++i) ASSERT_TRUE(s->Update(true).ok());
  EXPECT_EQ(s->scale(), 1);
}

TEST(LossScalerTest, FromConfig) {
  Config c;
  LossScalerOptions o = LossScalerOptions::FromConfig(c);
  EXPECT_FALSE(o.dynamic);
  EXPECT_EQ(o.init_scale, 1);
  c.fp16.enabled = true;
  c.fp16.initial_scale_power = 12;
  c.fp16.loss_scale_window = 50;
  c.fp16.hysteresis = 3;
  c.fp16.min_loss_scale = 0.5;
  o = LossScalerOptions::FromConfig(c);
  EXPECT_TRUE(o.dynamic);
  EXPECT_EQ(o.init_scale, 4096);
  EXPECT_EQ(o.scale_window, 50);
  EXPECT_EQ(o.delayed_shift, 3);
  EXPECT_EQ(o.min_scale, 0.5);
  c.fp16.loss_scale = 128;
  o = LossScalerOptions::FromConfig(c);
  EXPECT_FALSE(o.dynamic);
  Result<LossScaler> s = LossScaler::Create(o);
  ASSERT_TRUE(s.ok());
  ASSERT_TRUE(s->Update(true).ok());  // static: overflow is only a skipped step
  EXPECT_EQ(s->scale(), 128);
}

TEST(LossScalerTest, RejectsBadOptionsAndRestoresState) {
  LossScalerOptions o;
  o.scale_window = 0;
  EXPECT_EQ(LossScaler::Create(o).status().code(), StatusCode::kInvalidArgument);
  o = {};
  o.delayed_shift = 0;
  EXPECT_EQ(LossScaler::Create(o).status().code(), StatusCode::kInvalidArgument);
  o = {};
  o.init_scale = 0;
  EXPECT_EQ(LossScaler::Create(o).status().code(), StatusCode::kInvalidArgument);
  Result<LossScaler> a = LossScaler::Create({});
  Result<LossScaler> b = LossScaler::Create({});
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_TRUE(a->Update(true).ok());
  ASSERT_TRUE(a->Update(true).ok());
  b->Restore(a->state());
  ASSERT_TRUE(a->Update(false).ok());
  ASSERT_TRUE(b->Update(false).ok());
  EXPECT_EQ(a->scale(), b->scale());
  EXPECT_EQ(a->state().hysteresis, b->state().hysteresis);
  EXPECT_EQ(a->state().iter, b->state().iter);
}

}  // namespace
}  // namespace strata
