// The engine under NVMe faults injected into its own I/O engine (a real swap file, the
// real completion and error paths): a write that fails is reported, naming what was
// being written; when Step() or a hook fails, the engine refuses to train on and
// GatherMaster reads a whole step: exactly the last one that succeeded with the
// optimizer on NVMe, the failed one when only its parameter writes failed with the
// optimizer in memory. A write that fails after Step() returned (writes behind cross
// into the next forward) is reported by the next call that waits for it, ends training
// too, and undoes its whole step on every chunk.

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <future>
#include <memory>
#include <set>

#include "engine_harness.h"
#include "single_world.h"
#include "tiering/io_fault.h"

namespace strata::testing {
namespace {

// Lets `skip` NVMe reads or writes (`op`) through once armed, then fails the next `count`
// with EIO (every later one by default).
class FailIoAfter : public IoFaultHook {
 public:
  explicit FailIoAfter(IoOp op) : op_(op) {}
  void Arm(int64_t skip, int64_t count) {
    skip_ = skip;
    count_ = count;
    armed_ = true;
  }
  int64_t OnResult(const IoFaultPoint& point, int64_t result) override {
    if (!armed_ || point.op != op_) return result;
    const int64_t n = seen_.fetch_add(1);
    return n < skip_ || n - skip_ >= count_ ? result : -EIO;
  }
  int64_t seen() const { return seen_.load(); }  // matching attempts since armed

 private:
  const IoOp op_;
  std::atomic<bool> armed_{false};
  std::atomic<int64_t> skip_{0}, count_{INT64_MAX}, seen_{0};
};

struct FaultyRun {
  Status trained;            // the steps before the faults
  Status failed;             // the step under them (its Step(), else the trainer's Flush())
  bool step_failed = false;  // Step() or a hook failed and the engine refuses to train on
  bool hook_failed = false;  // ... and it was a hook
  Status after;              // BeginMicroBatch once Step() failed
  Status gathered;           // GatherMaster afterwards
  std::vector<std::vector<std::vector<float>>> params;
  int64_t ops_seen = 0;  // reads or writes (op) of the faulty step, failed or not
};

// `steps` clean steps, then `faulty_steps` whose NVMe reads or writes (`op`) fail with EIO
// after the first `skip` (`count` of them); then the master.
FaultyRun TrainThenFail(const Config& config, zero::TrainSpec spec, IoOp op, int64_t skip,
                        int64_t count = INT64_MAX, int faulty_steps = 1) {
  FaultyRun r;
  auto dev = EngineDevice(config);
  if (!dev.ok()) {
    r.trained = dev.status();
    return r;
  }
  auto modules = model::MlpModules(spec.model);
  ParamInit init = MlpInit(spec);
  auto faults = std::make_shared<FailIoAfter>(op);
  EngineResources res{&World(), dev->get()};
  res.io_fault_hook = faults;
  auto engine = Engine::Create(config, modules, init, res);
  if (!engine.ok()) {
    r.trained = engine.status();
    return r;
  }
  auto log = zero::TrainWithEngine(**engine, World(), config, spec);
  r.trained = log.ok() ? (*engine)->Flush() : log.status();
  if (!r.trained.ok()) return r;
  faults->Arm(skip, count);
  zero::TrainSpec one = spec;
  one.steps = faulty_steps;
  auto failed = zero::TrainWithEngine(**engine, World(), config, one);
  r.failed = failed.ok() ? (*engine)->Flush() : failed.status();
  r.ops_seen = faults->seen();
  if (!r.failed.ok()) {
    // The trainer flushes after its last step: a failure there came from a write the
    // step had left behind. Otherwise the engine trains no more, and says why.
    Status again = (*engine)->BeginMicroBatch();
    r.step_failed = again.ToString().find("engine: an earlier ") != std::string::npos;
    r.hook_failed = r.step_failed && again.ToString().find("an earlier Step() failed") == std::string::npos;
    r.after = again;
    if (r.step_failed) {
      auto step = (*engine)->Step();
      if (step.ok() || step.status().code() != StatusCode::kFailedPrecondition) {
        r.after =
            InternalError("Step() after a failed step: " + (step.ok() ? "ok" : step.status().ToString()));
        r.step_failed = false;
      }
    }
  }
  // A write that failed after Step() returned is reported once, by the next call that
  // waits for it (GatherMaster included); GatherMaster reads the master on the next call.
  for (int attempt = 0; attempt < 2; ++attempt) {
    r.gathered = OkStatus();
    r.params.clear();
    for (size_t m = 0; m < modules.modules.size() && r.gathered.ok(); ++m) {
      r.params.emplace_back();
      for (size_t t = 0; t < modules.modules[m].tensors.size() && r.gathered.ok(); ++t) {
        r.params.back().emplace_back();
        r.gathered = (*engine)->GatherMaster(modules.modules[m].tensors[t], &r.params.back().back());
      }
    }
    if (r.gathered.ok() || r.step_failed) break;
  }
  return r;
}

// TrainThenFail, but a hang (a lost completion) ends the test at once instead of at
// ctest's timeout.
FaultyRun TrainThenFailOrExit(const std::string& what, const Config& config, const zero::TrainSpec& spec,
                              IoOp op, int64_t skip, int64_t count = INT64_MAX, int faulty_steps = 1) {
  auto run = std::async(std::launch::async,
                        [&] { return TrainThenFail(config, spec, op, skip, count, faulty_steps); });
  if (run.wait_for(std::chrono::seconds(120)) != std::future_status::ready) {
    std::fprintf(stderr, "%s: no progress in 120 s after the faults (hang)\n", what.c_str());
    std::_Exit(1);
  }
  return run.get();
}

TEST(EngineFault, FailedNvmeWritesFailTheStepAndLoseNothing) {
  zero::TrainSpec spec = SmallSpec(3);
  int kept_checked = 0;   // failed steps whose committed master was compared
  int hook_failures = 0;  // ... of which a hook (not Step()) reported
  int whole_checked = 0;  // failed steps with the optimizer in memory whose master was compared
  for (const Combo& c : {Combo{3, "nvme", "nvme"}, Combo{3, "nvme", "cpu"}, Combo{3, "cpu", "nvme"},
                         Combo{3, "none", "nvme"}, Combo{3, "nvme", "nvme", "nvme"}}) {
    for (const char* extra : {"{}", R"({"strata": {"overlap": false}})"}) {
      const Config config = MakeConfig(c, extra);
      EngineRun clean = RunEngine(World(), config, spec);
      ASSERT_TRUE(clean.status.ok()) << ComboName(c) << ": " << clean.status.ToString();
      // The same engine through the faulty step with no fault: the master one step on.
      const bool in_memory = std::string(c.opt) != "nvme";
      FaultyRun stepped;
      if (in_memory) {
        stepped = TrainThenFailOrExit(ComboName(c) + " no faults", config, spec, IoOp::kWrite, INT64_MAX);
        ASSERT_TRUE(stepped.failed.ok() && stepped.gathered.ok()) << stepped.failed.ToString();
      }
      for (int64_t skip : {0, 1, 2}) {
        const std::string what =
            ComboName(c) + " " + extra + ", writes failing after " + std::to_string(skip);
        FaultyRun r = TrainThenFailOrExit(what, config, spec, IoOp::kWrite, skip);
        ASSERT_TRUE(r.trained.ok()) << what << ": " << r.trained.ToString();
        ASSERT_FALSE(r.failed.ok()) << what << ": writes failed and nothing said so";
        EXPECT_EQ(r.failed.code(), StatusCode::kIoError) << what << ": " << r.failed.ToString();
        EXPECT_NE(r.failed.ToString().find("writing"), std::string::npos)
            << what << ": the error should name what was being written: " << r.failed.ToString();
        ASSERT_TRUE(r.gathered.ok()) << what
                                     << ": reading the master after the failure: " << r.gathered.ToString();
        // Without overlap every chunk's writes are waited for inside Step(), or (gradients
        // on NVMe) in the backward's hooks. With overlap a write behind Step() can fail
        // after it returned, seen by the trainer's Flush. Every failure ends training.
        const bool must_fail_in_step = std::string(extra) != "{}";
        const bool behind =
            r.after.ToString().find("an earlier write behind Step() failed") != std::string::npos;
        EXPECT_TRUE(r.step_failed) << what << ": expected the engine to refuse after the failure; then "
                                   << r.after.ToString();
        if (must_fail_in_step) {
          EXPECT_FALSE(behind) << what << ": " << r.after.ToString();
        }
        hook_failures += r.hook_failed;
        if (!in_memory) {
          // The failed step is undone on every chunk, wherever its failure was seen.
          kept_checked++;
          EXPECT_TRUE(r.params == clean.params)
              << what << ": the failed step changed the committed parameters";
          continue;
        }
        // The optimizer in host memory: overlapped, the failed writes were the speculative
        // steps' and nothing was committed, or parameter writes behind a step that had
        // completed; serial, the state is updated in place, and the step completes its
        // update without writing the parameters: a whole step either way.
        whole_checked++;
        EXPECT_TRUE(r.params == (must_fail_in_step || behind ? stepped.params : clean.params))
            << what << ": the master after the failed step is not a whole step";
      }
    }
  }
  EXPECT_EQ(kept_checked, 18) << "the runs with the optimizer on NVMe (3 combinations x 2 x 3 fault points) "
                                 "must all reach the committed-master check";
  EXPECT_EQ(whole_checked, 12) << "the runs with the optimizer in memory (2 tiers x 2 x 3 fault points) must "
                                  "reach the whole-step check";
  std::printf("failures reported by a hook: %d; whole-step checks: %d\n", hook_failures, whole_checked);
}

// With accumulation the gradient shards on NVMe are written behind the backward and read
// back by the next micro-batch: a failed write or read there fails the step
// (the read waits for the write), names what failed, hangs nothing, and leaves the
// committed master as it was.
TEST(EngineFault, FailedGradientIoAroundTheBackwardFailsTheStep) {
  zero::TrainSpec spec = SmallSpec(3);
  const Combo c{3, "nvme", "none", "nvme"};
  for (const char* extra : {R"({"gradient_accumulation_steps": 2})",
                            R"({"gradient_accumulation_steps": 3, "strata": {"overlap": false}})"}) {
    const Config config = MakeConfig(c, extra);
    EngineRun clean = RunEngine(World(), config, spec);
    ASSERT_TRUE(clean.status.ok()) << clean.status.ToString();
    for (auto [op, verb] : {std::pair{IoOp::kWrite, "writ"}, std::pair{IoOp::kRead, "read"}}) {
      for (int64_t skip : {0, 1, 2}) {
        const std::string what =
            ComboName(c) + " " + extra + ", " + verb + "es failing after " + std::to_string(skip);
        // One read fails (the master is read back after it); every write does.
        FaultyRun r = TrainThenFailOrExit(what, config, spec, op, skip, op == IoOp::kRead ? 1 : INT64_MAX);
        ASSERT_TRUE(r.trained.ok()) << what << ": " << r.trained.ToString();
        ASSERT_FALSE(r.failed.ok()) << what << ": I/O failed and nothing said so";
        EXPECT_EQ(r.failed.code(), StatusCode::kIoError) << what << ": " << r.failed.ToString();
        EXPECT_NE(r.failed.ToString().find(verb), std::string::npos) << what << ": " << r.failed.ToString();
        EXPECT_TRUE(r.step_failed) << what << ": " << r.after.ToString();
        ASSERT_TRUE(r.gathered.ok()) << what << ": " << r.gathered.ToString();
        EXPECT_TRUE(r.params == clean.params) << what << ": the failed step changed the committed parameters";
      }
    }
  }
}

// Parameter shards read from NVMe fail in the forward's gathers: always a hook's error
// (Fetch), not Step()'s. Before, the engine went on taking calls, and a Step()
// after a failed hook could apply an incomplete window's gradients.
TEST(EngineFault, FailedHookEndsTrainingAndLosesNothing) {
  zero::TrainSpec spec = SmallSpec(3);
  for (const char* extra : {"{}", R"({"strata": {"overlap": false}})"}) {
    const Config config = MakeConfig(Combo{3, "cpu", "nvme"}, extra);
    EngineRun clean = RunEngine(World(), config, spec);
    ASSERT_TRUE(clean.status.ok()) << clean.status.ToString();
    for (int64_t skip : {0, 2}) {
      const std::string what = std::string(extra) + ", reads failing after " + std::to_string(skip);
      FaultyRun r = TrainThenFailOrExit(what, config, spec, IoOp::kRead, skip);
      ASSERT_TRUE(r.trained.ok()) << what << ": " << r.trained.ToString();
      EXPECT_EQ(r.failed.code(), StatusCode::kIoError) << what << ": " << r.failed.ToString();
      EXPECT_TRUE(r.hook_failed) << what << ": expected a hook to fail and the engine to refuse after; then "
                                 << r.after.ToString();
      EXPECT_NE(r.after.ToString().find("an earlier Fetch("), std::string::npos) << r.after.ToString();
      ASSERT_TRUE(r.gathered.ok()) << what << ": " << r.gathered.ToString();
      EXPECT_TRUE(r.params == clean.params) << what << ": the failed forward changed the parameters";
    }
  }
}

// One write of the faulty step fails, early or late: with writes behind, late ones fail
// after Step() returned, when the other chunks' writes of the step are on disk. The
// master must still be a whole step (before, the chunk whose write failed kept the step
// before and the others moved on), the failure must be reported, and the engine must
// refuse to train on.
TEST(EngineFault, OneLostWriteLosesTheWholeStep) {
  zero::TrainSpec spec = SmallSpec(3);
  int rolled_back = 0;  // runs whose master went back to the step before the faulty one
  int behind = 0;       // runs whose failure was first seen after Step() returned
  int next_step_checked = 0;
  for (const Combo& c : {Combo{3, "nvme", "none"}, Combo{3, "nvme", "nvme"},
                         Combo{3, "nvme", "cpu", "auto", kPiecedSubGroup}}) {
    for (const char* extra : {"{}", R"({"strata": {"overlap": false}})"}) {
      const Config config = MakeConfig(c, extra);
      EngineRun clean = RunEngine(World(), config, spec);
      ASSERT_TRUE(clean.status.ok()) << ComboName(c) << ": " << clean.status.ToString();
      // The same engine through the faulty step with no fault: the master one step on,
      // and how many writes the step makes.
      FaultyRun stepped =
          TrainThenFailOrExit(ComboName(c) + " no faults", config, spec, IoOp::kWrite, INT64_MAX);
      ASSERT_TRUE(stepped.failed.ok() && stepped.gathered.ok()) << stepped.failed.ToString();
      ASSERT_FALSE(stepped.params == clean.params) << "the step changed nothing";
      const int64_t writes = stepped.ops_seen;
      ASSERT_GE(writes, 3) << ComboName(c);
      for (int64_t j : std::set<int64_t>{0, writes / 2, writes - 2, writes - 1}) {
        const std::string what = ComboName(c) + " " + extra + ", write " + std::to_string(j) + " of " +
                                 std::to_string(writes) + " failing";
        FaultyRun r = TrainThenFailOrExit(what, config, spec, IoOp::kWrite, j, /*count=*/1);
        ASSERT_TRUE(r.trained.ok()) << what << ": " << r.trained.ToString();
        ASSERT_FALSE(r.failed.ok()) << what << ": a write failed and nothing said so";
        EXPECT_EQ(r.failed.code(), StatusCode::kIoError) << what << ": " << r.failed.ToString();
        EXPECT_TRUE(r.step_failed) << what
                                   << ": the engine trains on after losing a write: " << r.after.ToString();
        ASSERT_TRUE(r.gathered.ok()) << what
                                     << ": reading the master after the failure: " << r.gathered.ToString();
        const bool before = r.params == clean.params, after = r.params == stepped.params;
        EXPECT_TRUE(before || after) << what << ": the master is a mix of two steps";
        rolled_back += before;
        behind += r.after.ToString().find("an earlier write behind Step() failed") != std::string::npos;
      }
      // The step's last write fails while the next step runs: that step must not write
      // over the versions the lost step may need back (its speculation would otherwise
      // land in the slots the rollback returns to), and it cannot commit.
      const std::string what = ComboName(c) + " " + extra + ", last write failing, one more step";
      FaultyRun r = TrainThenFailOrExit(what, config, spec, IoOp::kWrite, writes - 1, /*count=*/1,
                                        /*faulty_steps=*/2);
      ASSERT_TRUE(r.trained.ok()) << what << ": " << r.trained.ToString();
      EXPECT_EQ(r.failed.code(), StatusCode::kIoError) << what << ": " << r.failed.ToString();
      EXPECT_TRUE(r.step_failed) << what << ": " << r.after.ToString();
      ASSERT_TRUE(r.gathered.ok()) << what << ": " << r.gathered.ToString();
      // With parameters on NVMe the last write may be a parameter shard's, which loses no
      // optimizer state: the master is then the faulty step's own.
      const bool before = r.params == clean.params, after = r.params == stepped.params;
      EXPECT_TRUE(before || (after && std::string(c.param) == "nvme"))
          << what << ": the master is not a whole step";
      next_step_checked++;
      rolled_back += before;
    }
  }
  std::printf("rolled back: %d; failures seen after Step() returned: %d\n", rolled_back, behind);
  EXPECT_GT(rolled_back, 0) << "no run lost an optimizer state write";
  EXPECT_GT(behind, 0) << "no write failed after Step() returned: the case this test is for was not reached";
  EXPECT_EQ(next_step_checked, 6);
}

}  // namespace
}  // namespace strata::testing
