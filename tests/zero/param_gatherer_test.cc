// The stage-3 gatherer (param_gatherer.h) alone, with gathers that only record what was
// asked: what starts when along the trace, what stays, and what it refuses.
#include "zero/param_gatherer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "strata/model.h"
#include "zero/gather_plan.h"

namespace strata::zero {
namespace {

// n modules of one 4096-element tensor each, one chunk apiece.
Layout OneChunkPerModule(int n) {
  ModelDecl m;
  for (int i = 0; i < n; ++i) {
    m.tensors.push_back({"w" + std::to_string(i), {4096}, std::nullopt});
    m.modules.push_back({"m" + std::to_string(i), {static_cast<TensorId>(i)}});
  }
  auto l = MakeLayout(m, 4096 * 4, 1);
  EXPECT_TRUE(l.ok()) << l.status().ToString();
  EXPECT_EQ(l->num_chunks, n);
  return *l;
}

// A gatherer over `layout` whose gathers complete at once (with `fail`'s chunk failing),
// recording the chunks in the order they were started.
struct Harness {
  explicit Harness(const Layout& layout, int fail = -1)
      : order(layout), gatherer(layout, order, [this, fail](int chunk, void* buf) {
          started.push_back(chunk);
          buffers_seen.push_back(buf);
          std::promise<Status> p;
          p.set_value(chunk == fail ? IoError("injected gather failure") : OkStatus());
          return p.get_future().share();
        }) {}
  void Configure(int buffers, int window, std::vector<uint8_t> kept = {}) {
    GatherPlan plan;
    plan.buffers = buffers;
    plan.max_prefetch_modules = window;
    plan.kept = std::move(kept);
    Configure(plan);
  }
  // `run_places`: by chunk, a run chunk's own place (nullptr: from the pool).
  void Configure(const GatherPlan& plan, std::vector<void*> run_places = {}) {
    std::vector<void*> bufs;
    for (int i = 0; i < plan.buffers; ++i) bufs.push_back(&memory[i]);
    gatherer.Configure(plan, std::move(bufs), std::move(run_places));
  }
  // Runs the module at the next trace position through its hooks.
  Status Use(UseKind kind, int module) {
    const int pos = order.Note(kind, module);
    STRATA_RETURN_IF_ERROR(gatherer.Enter(module, pos));
    gatherer.Leave(module, pos, /*last_micro_batch=*/true);
    return OkStatus();
  }
  CallOrder order;
  ParamGatherer gatherer;
  std::vector<int> started;
  std::vector<void*> buffers_seen;
  int memory[16] = {};
};

TEST(ParamGatherer, GathersTheWindowAheadInTraceOrder) {
  const Layout l = OneChunkPerModule(4);
  Harness h(l);
  h.Configure(/*buffers=*/3, /*window=*/2);
  ASSERT_TRUE(h.gatherer.Enter(0, h.order.Note(UseKind::kForward, 0)).ok());
  EXPECT_EQ(h.started, (std::vector<int>{0, 1, 2})) << "the module's chunk, then two modules ahead";
  EXPECT_NE(h.gatherer.Params(0), nullptr);
  h.gatherer.Leave(0, 0, true);
  for (int m = 1; m < 4; ++m) ASSERT_TRUE(h.Use(UseKind::kForward, m).ok());
  for (int m = 3; m >= 0; --m) ASSERT_TRUE(h.Use(UseKind::kBackward, m).ok());
  // Forward 0..3 gathers each once; at module 2 the window (two uses: forward and
  // backward of 3) no longer holds 2, so the backward gathers 2, 1 and 0 again.
  EXPECT_EQ(h.started, (std::vector<int>{0, 1, 2, 3, 2, 1, 0}));
  EXPECT_EQ(h.gatherer.TakeEvictions(), 0);
  EXPECT_TRUE(h.gatherer.DropAll().ok());
}

TEST(ParamGatherer, KeptChunksAreNotGatheredAgain) {
  const Layout l = OneChunkPerModule(4);
  Harness h(l);
  h.Configure(/*buffers=*/4, /*window=*/1, /*kept=*/{1, 1, 1, 0});
  for (int m = 0; m < 4; ++m) ASSERT_TRUE(h.Use(UseKind::kForward, m).ok());
  for (int m = 3; m >= 0; --m) ASSERT_TRUE(h.Use(UseKind::kBackward, m).ok());
  EXPECT_EQ(h.started, (std::vector<int>{0, 1, 2, 3})) << "0, 1 and 2 kept; 3 stays in the window";
}

TEST(ParamGatherer, NeverHoldsMoreThanItsBuffers) {
  const Layout l = OneChunkPerModule(6);
  Harness h(l);
  h.Configure(/*buffers=*/2, /*window=*/4);  // the window asks for more than the buffers
  for (int m = 0; m < 6; ++m) ASSERT_TRUE(h.Use(UseKind::kForward, m).ok());
  std::vector<void*> distinct = h.buffers_seen;
  std::sort(distinct.begin(), distinct.end());
  distinct.erase(std::unique(distinct.begin(), distinct.end()), distinct.end());
  EXPECT_EQ(distinct.size(), 2u);
}

TEST(ParamGatherer, RefusesWhenEveryBufferIsHeld) {
  const Layout l = OneChunkPerModule(2);
  Harness h(l);
  h.Configure(/*buffers=*/1, /*window=*/0);
  ASSERT_TRUE(h.gatherer.Enter(0, -1).ok());
  Status st = h.gatherer.Enter(1, -1);  // module 0 still runs on the only buffer
  EXPECT_EQ(st.code(), StatusCode::kOutOfBudget) << st.ToString();
  EXPECT_NE(st.ToString().find("raise strata.device_budget"), std::string::npos) << st.ToString();
}

TEST(ParamGatherer, AHeldChunkBlocksTheStep) {
  const Layout l = OneChunkPerModule(2);
  Harness h(l);
  h.Configure(2, 1);
  ASSERT_TRUE(h.gatherer.Enter(1, -1).ok());
  Status st = h.gatherer.CheckNoneHeld();
  EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(st.ToString().find("chunk 1"), std::string::npos) << st.ToString();
  EXPECT_EQ(h.gatherer.DropAll().code(), StatusCode::kFailedPrecondition);
  h.gatherer.Leave(1, -1, true);
  EXPECT_TRUE(h.gatherer.CheckNoneHeld().ok());
}

TEST(ParamGatherer, AGatherErrorReachesTheModuleThatNeedsIt) {
  const Layout l = OneChunkPerModule(3);
  Harness h(l, /*fail=*/1);
  h.Configure(3, 2);
  ASSERT_TRUE(h.Use(UseKind::kForward, 0).ok()) << "chunk 1's gather started, but 0 does not need it";
  Status st = h.Use(UseKind::kForward, 1);
  EXPECT_EQ(st.code(), StatusCode::kIoError);
  EXPECT_EQ(h.gatherer.DropAll().code(), StatusCode::kIoError) << "the failed gather is still reported";
}

TEST(ParamGatherer, OffTheTraceAnUnusedPrefetchIsEvicted) {
  const Layout l = OneChunkPerModule(4);
  Harness h(l);
  h.Configure(/*buffers=*/2, /*window=*/1);
  // Module 0 at its trace position prefetches chunk 1; a use off the trace (an
  // evaluation pass) of module 3 then needs a second buffer while 0 is held.
  ASSERT_TRUE(h.gatherer.Enter(0, h.order.Note(UseKind::kForward, 0)).ok());
  ASSERT_TRUE(h.gatherer.Enter(3, -1).ok());
  EXPECT_EQ(h.started, (std::vector<int>{0, 1, 3}));
  EXPECT_EQ(h.gatherer.TakeEvictions(), 1);
  EXPECT_EQ(h.gatherer.TakeEvictions(), 0) << "taken";
}

// One fixed buffer and room for `room_chunks` more, in the plain order.
GatherInputs Inputs(const Layout& l, const Trace& trace, const ZeroConfig& zero, uint64_t room_chunks);

TEST(ParamGatherer, ARunStaysGatheredInItsOwnPlacesAndTakesNoBuffer) {
  // Module 0's 8192 values are an outlier beside four modules of 1000: a run of chunks
  // 0 and 1 (4096 each); the four share chunk 2.
  ModelDecl m;
  for (int64_t n : {8192, 1000, 1000, 1000, 1000}) {
    m.modules.push_back({"m" + std::to_string(m.tensors.size()), {static_cast<TensorId>(m.tensors.size())}});
    m.tensors.push_back({"w" + std::to_string(m.tensors.size()), {n}, std::nullopt});
  }
  auto l = MakeLayout(m, 4096 * 4, 1);
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  ASSERT_EQ(l->num_chunks, 3);
  ASSERT_EQ(l->run_length[0], 2);
  // No reuse distance lets the keep plan keep anything but the last module's chunk:
  // releasing a run's chunks would free no memory, so they stay all the same.
  ZeroConfig zero;
  zero.stage3_max_reuse_distance = 0;
  const Trace trace = Trace::Assumed(5);
  const GatherPlanResult r = PlanGather(Inputs(*l, trace, zero, 1));
  EXPECT_TRUE(r.plan.kept[0] && r.plan.kept[1]) << "a run's chunks cost no buffer: kept";
  EXPECT_EQ(r.plan.max_prefetch_modules, 1);
  EXPECT_EQ(r.plan.buffers, 1) << "the runs take none: chunk 2 alone needs one";
  Harness h(*l);
  int run_memory[2] = {};
  h.Configure(r.plan, {&run_memory[0], &run_memory[1], nullptr});
  for (int mod = 0; mod < 5; ++mod) ASSERT_TRUE(h.Use(UseKind::kForward, mod).ok());
  for (int mod = 4; mod >= 0; --mod) {
    const int pos = h.order.Note(UseKind::kBackward, mod);
    ASSERT_TRUE(h.gatherer.Enter(mod, pos).ok());
    if (mod == 0) {
      EXPECT_EQ(h.gatherer.Params(0), &run_memory[0]);
      EXPECT_EQ(h.gatherer.Params(1), &run_memory[1]) << "the tensor's second chunk follows its first";
    }
    h.gatherer.Leave(mod, pos, true);
  }
  EXPECT_EQ(h.started, (std::vector<int>{0, 1, 2})) << "each gathered once in the micro-batch";
  EXPECT_TRUE(h.gatherer.DropAll().ok());
}

GatherInputs Inputs(const Layout& l, const Trace& trace, const ZeroConfig& zero, uint64_t room_chunks) {
  GatherInputs in;
  in.layout = &l;
  in.trace = &trace;
  in.zero = &zero;
  in.chunk_bytes = 4096 * 4;
  in.fixed_buffers = 1;
  in.room = room_chunks * in.chunk_bytes;
  return in;
}

TEST(GatherPlan, TheWindowStopsAtTheStagingBuffersAndTheRoom) {
  const Layout l = OneChunkPerModule(12);
  const Trace trace = Trace::Assumed(12);
  const ZeroConfig zero;
  GatherInputs in = Inputs(l, trace, zero, 20);
  EXPECT_EQ(PlanGather(in).plan.max_prefetch_modules, static_cast<int>(kMaxPrefetchModules));
  in.staging_limit = 3;
  EXPECT_EQ(PlanGather(in).plan.max_prefetch_modules, 3);
  in.room = 2 * in.chunk_bytes;
  const GatherPlanResult tight = PlanGather(in);
  EXPECT_EQ(tight.plan.max_prefetch_modules, 2);
  EXPECT_LE(tight.extra_bytes, in.room);
  EXPECT_EQ(tight.extra_bytes, static_cast<uint64_t>(tight.plan.buffers - 1) * in.chunk_bytes);
  in.room = 0;
  const GatherPlanResult none = PlanGather(in);
  EXPECT_EQ(none.plan.max_prefetch_modules, 0);
  EXPECT_EQ(none.plan.buffers, 1) << "the fixed buffer alone";
}

TEST(GatherPlan, KeepsChunksWithTheRoomLeft) {
  const Layout l = OneChunkPerModule(6);
  const Trace trace = Trace::Assumed(6);
  const ZeroConfig zero;
  const GatherPlanResult all = PlanGather(Inputs(l, trace, zero, 100));
  EXPECT_EQ(all.plan.kept_count(), 6) << "room for every chunk: nothing is gathered twice";
  EXPECT_EQ(all.plan.buffers, 6);
}

}  // namespace
}  // namespace strata::zero
