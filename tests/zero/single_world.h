// The world communicator of a test program that runs without mpirun (world size 1):
// made on first use, finalized once after the last test.
#pragma once

#include <gtest/gtest.h>

#include <memory>

#include "strata/comm.h"
#include "strata/status.h"

namespace strata::testing {

inline std::unique_ptr<Communicator>& WorldPtr() {
  static std::unique_ptr<Communicator> world;
  return world;
}

inline Communicator& World() {
  auto& w = WorldPtr();
  if (!w) {
    auto r = InitWorld(CommOptions{"world", 120});
    STRATA_CHECK_MSG(r.ok(), r.status().ToString());
    w = std::move(*r);
  }
  return *w;
}

class SingleWorldEnvironment : public ::testing::Environment {
 public:
  void TearDown() override {
    if (WorldPtr()) {
      WorldPtr().reset();
      EXPECT_TRUE(FinalizeWorld().ok());
    }
  }
};

inline const auto* const kSingleWorldEnv = ::testing::AddGlobalTestEnvironment(new SingleWorldEnvironment);

}  // namespace strata::testing
