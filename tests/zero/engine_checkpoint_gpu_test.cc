// Checkpoints of an engine training on a CUDA device (one rank): the optimizer state in
// HBM is saved through the device ops into the stream buffers and restored the same way,
// and a resumed run equals the unbroken one bit for bit in every tier. Skips with the
// reason where there is no usable GPU.
#include <sys/vfs.h>

#include <cstdlib>
#include <filesystem>

#include "checkpoint_checks.h"
#include "single_world.h"

namespace strata::testing {
namespace {

// The NVMe combinations and the checkpoints need a file system with O_DIRECT, and a GPU
// machine's /tmp may be tmpfs: then they go in the working directory (the build folder).
const bool kOnDisk = [] {
  constexpr long kTmpfsMagic = 0x01021994;
  struct statfs fs;
  if (std::getenv("TMPDIR") == nullptr && statfs("/tmp", &fs) == 0 &&
      static_cast<long>(fs.f_type) == kTmpfsMagic) {
    setenv("TMPDIR", std::filesystem::current_path().c_str(), 1);
  }
  return true;
}();

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
