// The GPU each rank takes (tools/model_engine.h): every rank of this one-node job has its
// own place among the node's ranks, 0 to size - 1 in rank order.
#include <gtest/gtest.h>

#include "tools/model_engine.h"
#include "zero/mpi_world.h"

namespace strata::tools {
namespace {

TEST(ModelEngine, EachRankOnANodeTakesItsOwnPlace) {
  Communicator& world = testing::MpiWorld();
  const Result<int> local = NodeLocalRank(world);
  ASSERT_TRUE(local.ok()) << local.status().ToString();
  // mpirun starts every rank on this machine.
  EXPECT_EQ(*local, world.rank());
}

}  // namespace
}  // namespace strata::tools
