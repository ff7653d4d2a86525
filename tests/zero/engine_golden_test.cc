// The MLP's results, bit for bit, against values stored from a known-good build: a change
// of the engine's structure (layout, trace, hooks) must not change a single bit of what
// it computes. The parity tests compare with a tolerance; this one does not.
//
// When a change is meant to alter the arithmetic (a different summation order, say),
// the failure prints the new hashes; replace the stored ones in the same commit and say
// why in its message.
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "engine_harness.h"
#include "single_world.h"

namespace strata::testing {
namespace {

// FNV-1a over the bytes of every value: parameters in module and tensor order, then the
// step losses.
uint64_t HashRun(const EngineRun& run) {
  uint64_t h = 1469598103934665603ull;
  auto add = [&h](const void* p, size_t n) {
    const auto* b = static_cast<const uint8_t*>(p);
    for (size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 1099511628211ull;
  };
  for (const auto& module : run.params) {
    for (const auto& tensor : module) add(tensor.data(), tensor.size() * sizeof(float));
  }
  for (double loss : run.log.losses) add(&loss, sizeof loss);
  return h;
}

struct Golden {
  Combo combo;
  const char* extra;  // merged into the config
  uint64_t hash;
};

const std::vector<Golden>& Goldens() {
  static const std::vector<Golden> g = {
      {{0, "none", "none"}, "", 0x2cb6b43d7869d5d6ull},
      {{1, "cpu", "none"}, "", 0x2cb6b43d7869d5d6ull},
      {{2, "none", "none"}, R"({"gradient_accumulation_steps": 2})", 0x4cad35f19312f645ull},
      {{3, "none", "none"}, "", 0x2cb6b43d7869d5d6ull},
      {{3, "cpu", "cpu"}, R"({"gradient_clipping": 0.05})", 0xbc91de0692542719ull},
      {{3, "nvme", "nvme"}, "", 0x2cb6b43d7869d5d6ull},
      {{3, "nvme", "nvme", "nvme", kPiecedSubGroup}, R"({"gradient_clipping": 0.05})", 0xbc91de0692542719ull},
      {{3, "nvme", "cpu"},
       R"({"bf16": {"enabled": true}, "gradient_accumulation_steps": 2})",
       0xaf4c92bb7b5d1fafull},
      {{3, "cpu", "nvme"},
       R"({"fp16": {"enabled": true, "initial_scale_power": 30}})",
       0x262e3edbc9adf069ull},
  };
  return g;
}

TEST(EngineGolden, MlpResultsAreBitIdenticalToTheStoredOnes) {
  for (const Golden& g : Goldens()) {
    const std::string name = ComboName(g.combo) + " " + g.extra;
    const Config config = MakeConfig(g.combo, g.extra);
    EngineRun run = RunEngine(World(), config, SmallSpec(6));
    ASSERT_TRUE(run.status.ok()) << name << ": " << run.status.ToString();
    ASSERT_EQ(run.log.losses.size(), 6u) << name;
    const uint64_t h = HashRun(run);
    char hex[32];
    std::snprintf(hex, sizeof hex, "0x%016llxull", static_cast<unsigned long long>(h));
    EXPECT_EQ(h, g.hash) << name << ": hash " << hex;
  }
}

}  // namespace
}  // namespace strata::testing
