// Randomized model-based test: random acquire / release / dirty / prefetch / evict /
// step sequences against a plain in-memory model of every block's bytes. After every
// operation: budgets held, every pinned block still holds exactly its last-written bytes
// and stays valid where it is pinned; every read returns the last written bytes.
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <random>

#include "tier_test_util.h"

namespace strata {
namespace {

using testing::MakeTierEnv;
using testing::Pattern;
using testing::TierEnvOptions;

struct Held {
  BlockHandle h;
  BlockId id;
  Tier tier;
};

struct ModelRun {
  uint64_t seed;
  bool synchronous;
  TierPolicy policy;
};

class TierModelTest : public ::testing::TestWithParam<ModelRun> {};

TEST_P(TierModelTest, MatchesPlainModel) {
  const ModelRun run = GetParam();
  TierEnvOptions o;
  o.chunks = 6;
  o.budgets = {24 << 10, 40 << 10, 0};
  o.policy = run.policy;
  o.synchronous = run.synchronous;
  o.max_prefetch_moves = 3;
  auto env = MakeTierEnv(o);
  TierManager& tm = *env.tm;
  std::mt19937_64 rng(run.seed);
  std::map<BlockId, std::vector<std::byte>> model;
  std::map<BlockId, Tier> home;
  std::vector<BlockId> ids;
  uint64_t pattern_seed = run.seed * 1000;
  for (uint32_t c = 0; c < o.chunks; ++c) {
    for (uint32_t p = 0; p < 2; ++p) {
      BlockId id{c, p, kWholeChunk};
      Tier h = (p == 1 && c == 1) ? Tier::kHost : Tier::kNvme;
      bool zero = rng() % 4 == 0;
      model[id] = zero ? std::vector<std::byte>(tm.BlockBytes(id)) : Pattern(tm.BlockBytes(id), ++pattern_seed);
      ASSERT_TRUE(tm.Register(id, h, zero ? std::span<const std::byte>() : model[id]).ok());
      home[id] = h;
      ids.push_back(id);
    }
  }
  std::vector<Held> held;
  int op = 0;
  auto where = [&] { return "seed " + std::to_string(run.seed) + " op " + std::to_string(op); };

  auto check = [&] {
    TierTelemetry t = tm.Telemetry();
    for (int i = 0; i < 2; ++i) {
      ASSERT_LE(t.used[i], t.budget[i]) << where();
      ASSERT_LE(t.high_water[i], t.budget[i]) << where();
    }
    for (Held& x : held) {
      ASSERT_EQ(std::memcmp(x.h.data(), model[x.id].data(), model[x.id].size()), 0)
          << "pinned block changed: " << where();
      auto valid = tm.ValidTiers(x.id);
      ASSERT_NE(std::find(valid.begin(), valid.end(), x.tier), valid.end()) << "pinned copy gone: " << where();
    }
  };
  auto write_new = [&](void* data, BlockId id) {
    model[id] = Pattern(model[id].size(), ++pattern_seed);
    std::memcpy(data, model[id].data(), model[id].size());
  };
  auto pinned_elsewhere = [&](BlockId id, Tier tier) {
    for (const Held& x : held) {
      if (x.id == id && x.tier != tier) return true;
    }
    return false;
  };

  for (op = 0; op < 300; ++op) {
    int r = static_cast<int>(rng() % 100);
    if (r < 40) {
      if (held.size() >= 3) held.erase(held.begin() + static_cast<long>(rng() % held.size()));
      BlockId id = ids[rng() % ids.size()];
      Tier tier = home[id] == Tier::kHost || rng() % 2 ? Tier::kDevice : Tier::kHost;
      if (home[id] == Tier::kHost && rng() % 2) tier = Tier::kHost;
      Access access = static_cast<Access>(rng() % 3);
      auto h = tm.Acquire(id, tier, access, "op" + std::to_string(op));
      if (!h.ok()) {
        StatusCode code = h.status().code();
        if (code == StatusCode::kFailedPrecondition) {
          ASSERT_TRUE(pinned_elsewhere(id, tier)) << h.status().ToString() << " " << where();
        } else {
          ASSERT_EQ(code, StatusCode::kOutOfBudget) << h.status().ToString() << " " << where();
          ASSERT_FALSE(held.empty()) << "OutOfBudget with nothing pinned: " << where();
        }
        continue;
      }
      Status s = h->Wait();
      if (!s.ok()) {
        ASSERT_EQ(s.code(), StatusCode::kOutOfBudget) << s.ToString() << " " << where();
        continue;
      }
      if (access != Access::kOverwrite) {
        ASSERT_EQ(std::memcmp(h->data(), model[id].data(), model[id].size()), 0) << "stale read: " << where();
      }
      if (access != Access::kRead) write_new(h->data(), id);
      held.push_back(Held{std::move(h).value(), id, tier});
    } else if (r < 55) {
      if (!held.empty()) held.erase(held.begin() + static_cast<long>(rng() % held.size()));
    } else if (r < 62) {
      if (held.empty()) continue;
      Held& x = held[rng() % held.size()];
      Status s = x.h.MarkDirty();
      if (s.ok()) {
        write_new(x.h.data(), x.id);
      } else {
        ASSERT_EQ(s.code(), StatusCode::kFailedPrecondition) << where();
        ASSERT_TRUE(pinned_elsewhere(x.id, x.tier)) << s.ToString() << " " << where();
      }
    } else if (r < 75) {
      std::vector<PrefetchRequest> list;
      for (int i = 0, n = 1 + static_cast<int>(rng() % 3); i < n; ++i) {
        BlockId id = ids[rng() % ids.size()];
        list.push_back(PrefetchRequest{id, rng() % 2 ? Tier::kDevice : Tier::kHost});
      }
      ASSERT_TRUE(tm.Prefetch(list).ok()) << where();
    } else if (r < 85) {
      BlockId id = ids[rng() % ids.size()];
      Tier tier = rng() % 2 ? Tier::kDevice : Tier::kHost;
      bool pinned_here = false;
      for (const Held& x : held) pinned_here |= x.id == id && x.tier == tier;
      Status s = tm.Evict(id, tier);
      if (pinned_here) {
        ASSERT_EQ(s.code(), StatusCode::kFailedPrecondition) << where();
      } else if (!s.ok()) {
        ASSERT_TRUE(s.code() == StatusCode::kFailedPrecondition || s.code() == StatusCode::kOutOfBudget)
            << s.ToString() << " " << where();
      }
    } else if (r < 90) {
      ASSERT_TRUE(tm.WaitAll().ok()) << where();
    } else if (r < 95) {
      tm.BeginStep();
    } else if (held.empty()) {
      BlockId id = ids[rng() % ids.size()];
      auto h = tm.Acquire(id, Tier::kHost, Access::kRead);
      ASSERT_TRUE(h.ok()) << h.status().ToString() << " " << where();
      ASSERT_TRUE(h->Wait().ok()) << where();
      ASSERT_EQ(std::memcmp(h->data(), model[id].data(), model[id].size()), 0) << where();
    }
    check();
    if (::testing::Test::HasFatalFailure()) return;
  }
  held.clear();
  ASSERT_TRUE(tm.WaitAll().ok());
  for (BlockId id : ids) {
    auto h = tm.Acquire(id, Tier::kHost, Access::kRead);
    ASSERT_TRUE(h.ok()) << h.status().ToString();
    ASSERT_TRUE(h->Wait().ok());
    ASSERT_EQ(std::memcmp(h->data(), model[id].data(), model[id].size()), 0) << "final read, seed " << run.seed;
  }
  TierTelemetry t = tm.Telemetry();
  EXPECT_GT(t.evictions, 0u);
}

std::vector<ModelRun> Runs() {
  std::vector<ModelRun> runs;
  for (uint64_t s = 1; s <= 48; ++s) {
    runs.push_back(ModelRun{s, s % 3 == 0, s % 2 ? TierPolicy::kLru : TierPolicy::kTrace});
  }
  return runs;
}

INSTANTIATE_TEST_SUITE_P(Seeds, TierModelTest, ::testing::ValuesIn(Runs()),
                         [](const ::testing::TestParamInfo<ModelRun>& info) {
                           return "seed" + std::to_string(info.param.seed) +
                                  (info.param.synchronous ? "_sync" : "_async") + "_" +
                                  std::string(TierPolicyName(info.param.policy));
                         });

}  // namespace
}  // namespace strata
