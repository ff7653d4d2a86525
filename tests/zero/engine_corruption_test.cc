// Corruption in the swap files, caught at the engine level: one byte of a real swap
// file (the optimizer state, the parameter shards or the gradient shards) is flipped
// mid-run, in a slot of a randomly chosen chunk and piece. A flip in the slot the next
// read uses must fail the run with Corruption naming the file, the slot and the offset
// of the checksum segment holding the byte. A flip in a slot the engine writes before
// it reads it again must change nothing: the losses and the final parameters equal an
// unflipped run's, bit for bit.
//
// When to flip. The slot must be quiet: no write to it in flight (it could land after
// the flip and erase it) and no read of it issued (it could have taken the bytes before
// the flip). Reads run ahead of their use (gathers prefetch, the optimizer reads state
// ahead), so the flip points are where the engine's own ordering rules both out:
//  - At a step's start (step_boundary, before its first micro-batch), after Flush(): the
//    last Step() waited for its reductions and speculative steps and dropped the reads
//    ahead nobody used; Flush() waited for the writes behind and settled the commits;
//    and nothing reads the swap again before the first forward hook, where gathers and
//    the optimizer's reads ahead start. Every read of the step comes after the flip.
//  - In the backward (before_backward(m)), for a chunk whose modules are all above m:
//    its gathers for the step were waited for by their hooks and, with one micro-batch
//    per step, nothing gathers it again before Step(). For a chunk not yet finished in
//    the last micro-batch (a module at or below m): its reduction, which reads the
//    gradient shard back to add to it, is not submitted before EndBackward of its
//    lowest module. WaitForReductions ends the earlier reductions, and waiting for the
//    chosen slot's write behind (grad_writes) puts the shard they wrote on disk first:
//    under load that write can still be in flight when the backward reaches the hook.

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <future>
#include <map>
#include <optional>
#include <random>

#include "engine_harness.h"
#include "single_world.h"
#include "zero/engine_impl.h"

namespace strata::testing {
namespace {

// What the flipped slot meets next: a read (the run must fail) or a write (nothing
// may change).
enum class Kind { kOptRead, kOptOverwritten, kParamRead, kParamOverwritten, kGradRead, kGradOverwritten };
constexpr Kind kKinds[] = {Kind::kOptRead,          Kind::kOptOverwritten, Kind::kParamRead,
                           Kind::kParamOverwritten, Kind::kGradRead,       Kind::kGradOverwritten};

const char* KindName(Kind k) {
  switch (k) {
    case Kind::kOptRead: return "optimizer state, read next";
    case Kind::kOptOverwritten: return "optimizer state, overwritten next";
    case Kind::kParamRead: return "parameter shard, read next";
    case Kind::kParamOverwritten: return "parameter shard, overwritten next";
    case Kind::kGradRead: return "gradient shard, read next";
    case Kind::kGradOverwritten: return "gradient shard, overwritten next";
  }
  return "?";
}

bool ReadNext(Kind k) { return k == Kind::kOptRead || k == Kind::kParamRead || k == Kind::kGradRead; }

// A configuration and the kinds of flip it can host.
struct Scenario {
  const char* name;
  Combo combo;
  const char* extra;
  std::vector<Kind> kinds;
};

const std::vector<Scenario>& Scenarios() {
  constexpr Kind kOR = Kind::kOptRead, kOW = Kind::kOptOverwritten, kPR = Kind::kParamRead,
                 kPW = Kind::kParamOverwritten, kGR = Kind::kGradRead, kGW = Kind::kGradOverwritten;
  // Flips into a parameter shard about to be overwritten need overlap off: with it on,
  // the chunk's speculative step may already have written the new shard when the
  // backward's hook runs, and the flip would then be read by the next step. Gradient
  // shards are read back only with accumulation or overlap off.
  static const std::vector<Scenario> scenarios = {
      // fp32: the gathers read the parameter shard from the master in the state slots.
      {"optimizer+params on nvme", {3, "nvme", "nvme"}, "{}", {kOR, kOW}},
      {"optimizer+params on nvme, pieces", {3, "nvme", "nvme", "auto", kPiecedSubGroup}, "{}", {kOR, kOW}},
      // 16-bit shards have a swap of their own, written behind the step.
      {"optimizer+params on nvme, bf16",
       {3, "nvme", "nvme"},
       R"({"bf16": {"enabled": true}})",
       {kOR, kOW, kPR}},
      {"optimizer+params on nvme, bf16, serial",
       {3, "nvme", "nvme"},
       R"({"bf16": {"enabled": true}, "strata": {"overlap": false}})",
       {kOR, kOW, kPR, kPW}},
      {"optimizer+params on nvme, small pieces, serial",
       {3, "nvme", "nvme", "auto", kSmallPieceSubGroup},
       R"({"strata": {"overlap": false}})",
       {kOR, kOW, kPR, kPW}},
      {"params on nvme", {3, "cpu", "nvme"}, "{}", {kPR}},
      {"params on nvme, serial", {3, "cpu", "nvme"}, R"({"strata": {"overlap": false}})", {kPR, kPW}},
      {"params on nvme, optimizer on device, serial",
       {3, "none", "nvme"},
       R"({"strata": {"overlap": false}})",
       {kPR, kPW}},
      {"optimizer+gradients on nvme, accumulation 2",
       {3, "nvme", "cpu", "nvme"},
       R"({"gradient_accumulation_steps": 2})",
       {kOR, kOW, kGR, kGW}},
      {"optimizer+gradients on nvme, serial",
       {3, "nvme", "none", "nvme"},
       R"({"strata": {"overlap": false}})",
       {kOR, kOW, kGR, kGW}},
      // Overlap on, no clipping, one micro-batch: the shards never reach the disk.
      {"optimizer+gradients+params on nvme", {3, "nvme", "nvme", "nvme"}, "{}", {kOR, kOW, kGW}},
  };
  return scenarios;
}

constexpr int kSteps = 4;

// A swap directory of its own for each run, removed after it.
class TempDir {
 public:
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "strata-corrupt-XXXXXX").string();
    STRATA_CHECK_MSG(::mkdtemp(tmpl.data()) != nullptr, "mkdtemp failed");
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

Config ScenarioConfig(const Scenario& scenario, const std::string& swap_dir) {
  Config config = MakeConfig(scenario.combo, scenario.extra);
  config.zero.offload_optimizer.nvme_path = {swap_dir};
  config.zero.offload_param.nvme_path = {swap_dir};
  config.strata.swap_paths = {swap_dir};
  return config;
}

// XORs one byte of `path` with `mask`, through O_DIRECT as the engine reads and writes
// (no page cache between the two): a read-modify-write of the 4 KiB block holding it.
Status FlipByte(const std::string& path, uint64_t offset, uint8_t mask) {
  constexpr uint64_t kBlock = 4096;
  const int fd = ::open(path.c_str(), O_RDWR | O_DIRECT | O_CLOEXEC);
  if (fd < 0) return ErrnoError(errno, "opening " + path);
  void* block = std::aligned_alloc(kBlock, kBlock);
  const off_t at = static_cast<off_t>(offset / kBlock * kBlock);
  Status st;
  if (::pread(fd, block, kBlock, at) != static_cast<ssize_t>(kBlock)) {
    st = ErrnoError(errno, "reading " + path);
  } else {
    static_cast<uint8_t*>(block)[offset - at] ^= mask;
    if (::pwrite(fd, block, kBlock, at) != static_cast<ssize_t>(kBlock))
      st = ErrnoError(errno, "writing " + path);
  }
  std::free(block);
  ::close(fd);
  return st;
}

struct Flip {
  std::string path;
  SlotId slot = 0;
  uint64_t offset = 0;  // in the file
  std::string what;     // the target, for messages
};

// When to flip: at the start of `step`, or (module >= 0) in its backward, once
// BeginBackward(module) of micro-batch `micro_batch` returned.
struct Plan {
  Kind kind;
  int step = 1;
  int module = -1;
  int micro_batch = 0;
};

// The lowest module using each chunk (the MLP's modules use them in ascending order).
std::vector<int> FirstModules(const zero::Layout& l) {
  std::vector<int> first(l.num_chunks, -1);
  for (int m = l.num_modules() - 1; m >= 0; --m) {
    for (int c : l.module_chunks[m]) first[c] = m;
  }
  return first;
}

// Draws when to flip for `kind`: a step after the first; for the flips in the backward
// (their scenarios run one micro-batch with overlap off, or accumulate), a module that
// leaves a candidate chunk (ChooseTarget).
Plan DrawPlan(Kind kind, const Engine::Impl& s, std::mt19937_64& rng) {
  Plan plan{kind};
  plan.step = 1 + static_cast<int>(rng() % (kSteps - 1));
  const int modules = s.layout.num_modules();
  const int accum = s.config.gradient_accumulation_steps;
  if (kind == Kind::kParamOverwritten || (kind == Kind::kGradRead && accum == 1)) {
    // A chunk whose backward is over: some chunk must start above the module.
    std::vector<int> candidates;
    for (int m = 0; m < modules; ++m) {
      for (int first : FirstModules(s.layout)) {
        if (first > m) {
          candidates.push_back(m);
          break;
        }
      }
    }
    plan.module = candidates[rng() % candidates.size()];
  } else if (kind == Kind::kGradRead) {
    // The last micro-batch, before a chunk's reduction reads the earlier ones' sum back.
    plan.module = static_cast<int>(rng() % modules);
    plan.micro_batch = accum - 1;
  }
  return plan;
}

// The byte to flip: drawn in what the last write of the slot stored, and placed in its
// file by the store's layout (nvme_store.h: slots one after the other in a logical
// space striped over the files).
Flip Target(const NvmeStore& store, SlotId slot, uint64_t written, std::mt19937_64& rng,
            const std::string& what) {
  const uint64_t logical = uint64_t{slot} * store.slot_size() + rng() % written;
  const uint64_t stripe = store.stripe_size(), files = store.files().size();
  const uint64_t s = logical / stripe;
  return Flip{store.files()[s % files], slot, (s / files) * stripe + logical % stripe, what};
}

// Draws one element of `v` (which must not be empty).
template <typename T>
T Draw(const std::vector<T>& v, std::mt19937_64& rng) {
  return v[rng() % v.size()];
}

// Chooses the slot and byte for `plan`, at its flip point; nullopt with `why` set when
// the engine offers no target.
std::optional<Flip> ChooseTarget(const Plan& plan, Engine::Impl& s, std::mt19937_64& rng, std::string* why) {
  const int chunks = s.layout.num_chunks;
  const auto label = [&](const char* kind, int chunk) {
    return std::string(kind) + " of chunk " + std::to_string(chunk) + " at step " +
           std::to_string(plan.step) +
           (plan.module >= 0 ? ", backward of module " + std::to_string(plan.module) : ", start");
  };
  switch (plan.kind) {
    case Kind::kOptRead:
    case Kind::kOptOverwritten: {
      if (!s.nvme_opt || s.nvme_opt->store() == nullptr) break;
      const zero::PieceShape& shape = s.piece_shape;
      std::vector<std::pair<int, int>> live;
      for (int c = 0; c < chunks; ++c) {
        for (int p = 0; p < shape.pieces; ++p) {
          if (shape.Live(c, p)) live.emplace_back(c, p);
        }
      }
      const auto [c, p] = Draw(live, rng);
      const bool read = plan.kind == Kind::kOptRead;
      const SlotId slot = read ? s.NextStateSlot(c, p) : s.NextStateWriteSlot(c, p);
      return Target(*s.nvme_opt->store(), slot, shape.Bytes(p), rng,
                    label("state", c) + " piece " + std::to_string(p) + (read ? " (committed)" : " (spare)"));
    }
    case Kind::kParamRead:
    case Kind::kParamOverwritten: {
      if (!s.param_store) break;
      std::vector<int> candidates;
      for (int c = 0; c < chunks; ++c) {
        // Read next: the forward gathers every chunk, from disk unless a copy kept in
        // memory serves it. Overwritten next: a chunk whose backward is over.
        const bool ok =
            plan.kind == Kind::kParamRead ? !s.HasFreshShard(c) : FirstModules(s.layout)[c] > plan.module;
        if (ok) candidates.push_back(c);
      }
      if (candidates.empty()) {
        *why = "every chunk's next gather may copy its shard from memory";
        return std::nullopt;
      }
      const int c = Draw(candidates, rng);
      return Target(*s.param_store, s.param_shard[c].slot, s.opt_elems * s.csize, rng,
                    label("parameter shard", c));
    }
    case Kind::kGradRead:
    case Kind::kGradOverwritten: {
      if (!s.grad_store) break;
      std::vector<int> candidates;
      for (int c = 0; c < chunks; ++c) {
        const int first = FirstModules(s.layout)[c];
        // Read next, accumulating: a chunk whose reduction in this micro-batch is still
        // to come. Read next by Step() (overlap off): one whose backward is over.
        const bool ok = plan.kind == Kind::kGradOverwritten ||
                        (plan.micro_batch > 0 ? first <= plan.module : first > plan.module);
        if (ok) candidates.push_back(c);
      }
      const int c = Draw(candidates, rng);
      return Target(*s.grad_store, s.opt[c].grad_slot, s.grad_slot_bytes, rng, label("gradient shard", c));
    }
  }
  *why = "the engine has no such store";
  return std::nullopt;
}

struct CorruptRun {
  Status status;  // the run's
  zero::TrainLog log;
  std::vector<std::vector<std::vector<float>>> params;
  std::optional<Flip> flip;
  Status flip_error;  // the flip could not be made where planned
};

// Trains kSteps steps of `scenario` in a fresh swap directory, flipping as `plan` says
// (none: an unflipped run).
CorruptRun RunWithFlip(const Scenario& scenario, std::optional<Plan> plan, uint64_t seed) {
  CorruptRun r;
  TempDir dir;
  const Config config = ScenarioConfig(scenario, dir.path());
  zero::TrainSpec spec = SmallSpec(kSteps);
  auto dev = EngineDevice(config);
  auto modules = model::MlpModules(spec.model);
  auto engine = dev.ok()
                    ? Engine::Create(config, modules, MlpInit(spec), EngineResources{&World(), dev->get()})
                    : Result<std::unique_ptr<Engine>>(dev.status());
  if (!engine.ok()) {
    r.status = engine.status();
    return r;
  }
  Engine::Impl& s = Engine::Impl::Of(**engine);
  std::mt19937_64 rng(seed);
  if (plan) plan = DrawPlan(plan->kind, s, rng);
  const int top = static_cast<int>(modules.modules.size()) - 1;
  int step_now = -1, micro_batch = -1;  // micro-batches counted at the top module's backward
  auto flip_now = [&] {
    std::string why;
    r.flip = ChooseTarget(*plan, s, rng, &why);
    if (!r.flip) {
      r.flip_error = FailedPreconditionError(why);
      return;
    }
    // The comm worker is idle here (every reduction was waited for), so the training
    // thread may wait on its write-behind queue.
    if (plan->kind == Kind::kGradRead) r.flip_error = s.grad_writes.WaitSlot(r.flip->slot);
    if (!r.flip_error.ok()) return;
    r.flip_error = FlipByte(r.flip->path, r.flip->offset, static_cast<uint8_t>(1 + rng() % 255));
  };
  if (plan) {
    spec.step_boundary = [&](int step, bool end) {
      if (end) return;
      step_now = step;
      micro_batch = -1;
      if (step != plan->step) return;
      r.flip_error = (*engine)->Flush();
      if (r.flip_error.ok() && plan->module < 0) flip_now();
    };
    spec.before_backward = [&](int m) {
      if (m == top) ++micro_batch;
      if (step_now != plan->step || m != plan->module || micro_batch != plan->micro_batch || r.flip ||
          !r.flip_error.ok()) {
        return;
      }
      s.WaitForReductions();
      flip_now();
    };
  }
  auto log = zero::TrainWithEngine(**engine, World(), config, spec);
  r.status = log.ok() ? OkStatus() : log.status();
  if (!log.ok()) return r;
  r.log = *log;
  for (size_t m = 0; m < modules.modules.size() && r.status.ok(); ++m) {
    r.params.emplace_back();
    for (size_t t = 0; t < modules.modules[m].tensors.size() && r.status.ok(); ++t) {
      r.params.back().emplace_back();
      r.status = (*engine)->GatherMaster(modules.modules[m].tensors[t], &r.params.back().back());
    }
  }
  return r;
}

// RunWithFlip, but a hang (a read or error path that never completes) ends the test at once
// instead of at ctest's timeout.
CorruptRun RunOrExit(const std::string& what, const Scenario& scenario, std::optional<Plan> plan,
                     uint64_t seed) {
  auto run = std::async(std::launch::async, [&] { return RunWithFlip(scenario, plan, seed); });
  if (run.wait_for(std::chrono::seconds(120)) != std::future_status::ready) {
    std::fprintf(stderr, "%s: no progress in 120 s (hang)\n", what.c_str());
    std::_Exit(1);
  }
  return run.get();
}

// The Corruption error must name the flipped file, the slot, and a checksum segment
// (its file offset and length) that holds the flipped byte.
void ExpectNamesTheFlip(const Status& st, const Flip& flip, const std::string& what) {
  ASSERT_EQ(st.code(), StatusCode::kCorruption) << what << ": " << st.ToString();
  const std::string& msg = st.message();
  EXPECT_NE(msg.find(flip.path), std::string::npos) << what << ": the error does not name the file: " << msg;
  EXPECT_NE(msg.find("slot " + std::to_string(flip.slot) + ","), std::string::npos)
      << what << ": the error does not name the slot: " << msg;
  // "... offset <begin>, <length> bytes ..." (sscanf: std::regex trips gcc 12's
  // maybe-uninitialized warning under the sanitizers).
  const size_t at = msg.find("offset ");
  ASSERT_NE(at, std::string::npos) << what << ": " << msg;
  unsigned long long begin = 0, length = 0;
  ASSERT_EQ(std::sscanf(msg.c_str() + at, "offset %llu, %llu bytes", &begin, &length), 2)
      << what << ": " << msg;
  EXPECT_TRUE(begin <= flip.offset && flip.offset < begin + length)
      << what << ": the flipped byte at offset " << flip.offset << " is not in the segment named: " << msg;
}

TEST(EngineCorruption, FlipsAreCaughtWhenReadAndHarmlessWhenOverwritten) {
  const auto start = std::chrono::steady_clock::now();
  const std::vector<Scenario>& scenarios = Scenarios();
  std::map<size_t, CorruptRun> unflipped;  // by scenario
  std::map<Kind, int> checked;
  constexpr int kSeeds = 60;
  for (uint64_t seed = 1; seed <= kSeeds; ++seed) {
    // Every kind of flip equally often; the scenario, step, chunk, piece and byte at random.
    const Kind kind = kKinds[seed % std::size(kKinds)];
    std::mt19937_64 rng(seed * 0x9e3779b97f4a7c15ull);
    std::vector<size_t> hosts;
    for (size_t i = 0; i < scenarios.size(); ++i) {
      if (std::find(scenarios[i].kinds.begin(), scenarios[i].kinds.end(), kind) != scenarios[i].kinds.end())
        hosts.push_back(i);
    }
    const size_t si = Draw(hosts, rng);
    const Scenario& scenario = scenarios[si];
    std::string what = "seed " + std::to_string(seed) + ", " + scenario.name + ", " + KindName(kind);
    CorruptRun r = RunOrExit(what, scenario, Plan{kind}, rng());
    ASSERT_TRUE(r.flip_error.ok()) << what << ": " << r.flip_error.ToString();
    ASSERT_TRUE(r.flip.has_value()) << what << ": the flip point was never reached; " << r.status.ToString();
    what += " (" + r.flip->what + ", " + r.flip->path + " offset " + std::to_string(r.flip->offset) + ")";
    std::printf("seed %llu: %s: %s -> %s\n", static_cast<unsigned long long>(seed), scenario.name,
                r.flip->what.c_str(), r.status.ok() ? "ok" : r.status.ToString().substr(0, 90).c_str());
    if (ReadNext(kind)) {
      ASSERT_FALSE(r.status.ok()) << what << ": the flipped byte was read back and nothing said so";
      ExpectNamesTheFlip(r.status, *r.flip, what);
    } else {
      ASSERT_TRUE(r.status.ok()) << what << ": " << r.status.ToString();
      if (!unflipped.count(si)) unflipped[si] = RunOrExit(scenario.name, scenario, std::nullopt, 0);
      const CorruptRun& clean = unflipped[si];
      ASSERT_TRUE(clean.status.ok()) << scenario.name << ": " << clean.status.ToString();
      EXPECT_EQ(r.log.losses, clean.log.losses) << what << ": the overwritten flip changed the losses";
      EXPECT_TRUE(r.params == clean.params) << what << ": the overwritten flip changed the final parameters";
    }
    checked[kind]++;
  }
  for (Kind k : kKinds) EXPECT_EQ(checked[k], kSeeds / static_cast<int>(std::size(kKinds))) << KindName(k);
  std::printf("%d flips checked in %.1f s\n", kSeeds,
              std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
}

}  // namespace
}  // namespace strata::testing
