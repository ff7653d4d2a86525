// ExportSafetensors under mpirun -np 2 and -np 4 (label mpi): a checkpoint saved by every
// rank, each writing its shard of every chunk (stages 1 and 3) or rank 0 alone (stage 0),
// exports on one rank to tensors equal to Engine::GatherMaster, tensors that span two
// ranks' shards included (checkpoint_export_checks.h).
#include <gmock/gmock.h>

#include <filesystem>

#include "checkpoint_export_checks.h"
#include "mpi_world.h"

namespace strata::testing {
namespace {

Communicator& World() { return MpiWorld(); }

TEST(CheckpointExportMpi, ExportOfEveryRanksShardsEqualsGatherMaster) {
  for (const Combo& c : {Combo{3, "cpu", "none"}, Combo{1, "none", "none"}, Combo{0, "none", "none"}}) {
    SCOPED_TRACE(ComboName(c));
    const std::string name = "export-mpi-stage" + std::to_string(c.stage);
    const ExportSubject s = SaveForExport(World(), name, c);
    if (World().rank() == 0) {
      for (DType d : {DType::kF32, DType::kBf16}) {
        CheckExport(s, d, CheckpointRoot(name) + "/weights-" + std::string(DTypeName(d)) + ".safetensors");
      }
    }
    ASSERT_TRUE(World().Barrier().Wait().ok());
  }
}

// Tensors of three chunks (runs): every rank's shard of each of the run's chunks.
TEST(CheckpointExportMpi, TensorsLargerThanAChunkExportWhole) {
  for (const Combo& c : {Combo{3, "nvme", "nvme"}, Combo{0, "none", "none"}}) {
    SCOPED_TRACE(ComboName(c));
    const std::string name = "export-mpi-runs-stage" + std::to_string(c.stage);
    const ExportSubject s = SaveForExport(World(), name, c, /*runs=*/true);
    if (World().rank() == 0) CheckExport(s, DType::kF32, CheckpointRoot(name) + "/weights.safetensors");
    ASSERT_TRUE(World().Barrier().Wait().ok());
  }
}

}  // namespace
}  // namespace strata::testing
