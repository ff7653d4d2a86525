// The engine against the reference under mpirun -np 2 and -np 4 (label mpi).
#include <cerrno>
#include <chrono>

#include "engine_checks.h"
#include "fake_gpu.h"
#include "mpi_world.h"
#include "tiering/io_fault.h"

namespace strata::testing {
namespace {

Communicator& World() { return MpiWorld(); }

TEST(EngineMpi, EveryStageAndOffloadMatchesTheReference) { CheckAllCombos(World()); }
TEST(EngineMpi, OverlappedStepEqualsSerialStep) { CheckOverlapEqualsSerial(World(), ""); }
TEST(EngineMpi, OverlappedStepEqualsSerialStepWhenClipping) {
  CheckOverlapEqualsSerial(World(), R"({"gradient_clipping": 0.05})");
}
TEST(EngineMpi, AccumulationEqualsLargerBatch) { CheckAccumulation(World()); }
TEST(EngineMpi, ClippingMatchesTheReference) { CheckClipping(World()); }
TEST(EngineMpi, Fp16OverflowStepsAreSkippedAsInTheReference) { CheckFp16Overflow(World()); }
TEST(EngineMpi, Bf16MatchesTheReference) { CheckBf16(World()); }
TEST(EngineMpi, ParameterShardsOnTheDeviceMatchTheReference) { CheckCombos(World(), ParamDeviceCombos()); }

// A rank whose parameter reads fail abandons its step and joins no more collectives. It
// tells the others, so every rank's training ends within seconds, not at the engine
// communicator's watchdog (120 s), and each names the failed rank and its error.
void ExpectAFailingRankEndsEveryRanksTraining(bool one_node_per_rank) {
  CommOptions options{"engine-world", 120};
  options.one_node_per_rank = one_node_per_rank;
  auto engine_world = InitWorld(options);
  ASSERT_TRUE(engine_world.ok()) << engine_world.status().ToString();
  Communicator& comm = **engine_world;
  const int failing = comm.size() - 1;
  zero::TrainSpec spec = SmallSpec(2);
  const Config config = MakeConfig({3, "cpu", "nvme"});
  auto dev = EngineDevice(config);
  ASSERT_TRUE(dev.ok()) << dev.status().ToString();
  auto modules = model::MlpModules(spec.model);
  ParamInit init = MlpInit(spec);
  EngineResources res{&comm, dev->get()};
  if (comm.rank() == failing) {
    auto faults = std::make_shared<ScriptedFaults>();
    faults->Add({ScriptedFaults::Kind::kError, EIO, /*attempt=*/-1, /*offset=*/-1, /*op=*/0, /*times=*/-1});
    res.io_fault_hook = faults;
  }
  Status trained;
  double took = 0;
  {
    auto engine = Engine::Create(config, modules, init, res);
    ASSERT_TRUE(engine.ok()) << engine.status().ToString();
    auto t0 = std::chrono::steady_clock::now();
    auto log = zero::TrainWithEngine(**engine, comm, config, spec);
    took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    trained = log.status();
  }
  EXPECT_FALSE(trained.ok()) << "rank " << comm.rank() << " trained on";
  EXPECT_LT(took, 30.0) << "rank " << comm.rank() << ": " << trained.ToString();
  if (comm.rank() == failing) {
    EXPECT_EQ(trained.code(), StatusCode::kIoError) << trained.ToString();
  } else {
    EXPECT_NE(trained.message().find("rank " + std::to_string(failing) + " failed: Fetch("),
              std::string::npos)
        << trained.ToString();
  }
  // Everyone meets on the healthy world, then frees the failed communicator together.
  ASSERT_TRUE(World().Barrier().Wait().ok());
  engine_world->reset();
  EXPECT_TRUE(World().Barrier().Wait().ok());
}

TEST(EngineMpi, ARankThatFailsEndsEveryRanksTrainingAtOnce) {
  ExpectAFailingRankEndsEveryRanksTraining(false);
}

// Ranks on other nodes learn it by a message, not the node's watch board.
TEST(EngineMpi, ARankThatFailsEndsTrainingOnOtherNodesAtOnce) {
  ExpectAFailingRankEndsEveryRanksTraining(true);
}

// Each gather is a collective, so every rank must gather, keep and release the same
// chunks. A rank with more device room than the others plans with the least any rank
// has: here rank r's device has r MiB more, and the result equals a run where every
// rank has the same device. (Planned per rank, the richer ranks kept chunks the others
// gathered again, and the all-gathers no longer matched.)
TEST(EngineMpi, RanksWithDifferentDeviceRoomKeepTheSameChunks) {
  zero::TrainSpec spec = SmallSpec(3);
  spec.model.hidden.assign(8, 64);
  const Config config = MakeConfig({3, "cpu", "cpu"});
  const uint64_t base = 256 << 10;
  EngineRun same = RunEngine(World(), config, spec, DeviceKind::kSim, base);
  ASSERT_TRUE(same.status.ok()) << same.status.ToString();
  ASSERT_GT(same.kept_chunks, 0);
  ASSERT_LT(same.kept_chunks, same.num_chunks) << "the base device must be too small to keep every chunk";
  const uint64_t mine = base + static_cast<uint64_t>(World().rank()) * (1 << 20);
  EngineRun mixed = RunEngine(World(), config, spec, DeviceKind::kSim, mine);
  ASSERT_TRUE(mixed.status.ok()) << mixed.status.ToString();
  EXPECT_EQ(mixed.kept_chunks, same.kept_chunks);
  EXPECT_TRUE(BitIdentical(same, mixed));
}

// On a GPU the gradients and parameters are reduced and gathered in device memory, which
// the MPI world cannot take: Create refuses a missing or host device communicator by
// name, before it touches the device (so a fake GPU serves, without a GPU).
TEST(EngineMpi, CudaDeviceNeedsADeviceCommunicator) {
  FakeGpu gpu;
  const zero::TrainSpec spec = SmallSpec(1);
  ParamInit init = [&](TensorId id, int64_t b, int64_t n, float* out) {
    model::InitMlpTensor(spec.model, id, b, n, out);
  };
  const Config config = MakeConfig({2, "none", "none"});
  auto missing = Engine::Create(config, model::MlpModules(spec.model), init, EngineResources{&World(), &gpu});
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kInvalidArgument) << missing.status().ToString();
  EXPECT_NE(missing.status().message().find("EngineResources.device_comm is required"), std::string::npos)
      << missing.status().message();
  EXPECT_NE(missing.status().message().find("CreateNcclCommunicator"), std::string::npos)
      << missing.status().message();

  EngineResources host_comm{&World(), &gpu};
  host_comm.device_comm = &World();
  auto wrong = Engine::Create(config, model::MlpModules(spec.model), init, host_comm);
  ASSERT_FALSE(wrong.ok());
  EXPECT_EQ(wrong.status().code(), StatusCode::kInvalidArgument) << wrong.status().ToString();
  EXPECT_NE(wrong.status().message().find("must be a device (NCCL) communicator"), std::string::npos)
      << wrong.status().message();
}

}  // namespace
}  // namespace strata::testing
