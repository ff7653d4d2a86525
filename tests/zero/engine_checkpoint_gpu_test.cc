// Checkpoints of an engine training on a CUDA device (one rank): the optimizer state in
// HBM is saved through the device ops into the stream buffers and restored the same way,
// and a resumed run equals the unbroken one bit for bit in every tier. Skips with the
// reason where there is no usable GPU.
#include <sys/vfs.h>

#include <cstdlib>
#include <filesystem>

#include "checkpoint_checks.h"
#include "single_world.h"
#include "tmp_on_disk.h"

namespace strata::testing {
namespace {

const bool kOnDisk = testing::MoveTmpOffTmpfs();

TEST(EngineCheckpointGpu, EveryTierResumesBitExact) {
  const CudaProbe probe = ProbeCuda();
  if (!probe.available) GTEST_SKIP() << "no usable GPU: " << probe.reason;
  const ResumeSubject subject = MlpSubject(World(), SmallSpec(), DeviceKind::kCuda);
  for (const char* dtype : {"", R"(, "bf16": {"enabled": true})"}) {
    for (const Combo& c : ResumeCombos()) {
      CheckResumeBitExact(subject, c, c, std::string(R"({"strata": {"device": "cuda"})") + dtype + "}");
    }
  }
}

}  // namespace
}  // namespace strata::testing
