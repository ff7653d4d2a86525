// GoogleTest entry point for *_mpi_test.cc, run under `mpirun -np N`.
//  - MPI is started through strata::InitWorld (MPI_THREAD_MULTIPLE, checked); tests
//    make their own communicators with InitWorld (each call is a new MPI_Comm_dup).
//  - Rank 0 prints GoogleTest's usual output; other ranks print only their failures,
//    prefixed "[rank N]".
//  - The exit code is the same on every rank: non-zero when a test failed on any rank.
#include <gtest/gtest.h>

#include <cstdio>

#include "strata/comm.h"
#include "strata/log.h"

namespace {

class RankFailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit RankFailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& r) override {
    if (!r.failed()) return;
    std::fprintf(stderr, "[rank %d] %s:%d: Failure\n%s\n", rank_, r.file_name() ? r.file_name() : "?",
                 r.line_number(), r.message());
  }
  void OnTestEnd(const ::testing::TestInfo& t) override {
    if (t.result()->Failed()) std::fprintf(stderr, "[rank %d] [  FAILED  ] %s.%s\n", rank_, t.test_suite_name(), t.name());
  }

 private:
  int rank_;
};

}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  strata::InitLoggingFromEnv();
  strata::CommOptions options;
  options.name = "test-main";
  options.collective_timeout_s = 60;
  auto world = strata::InitWorld(options);
  if (!world.ok()) {
    std::fprintf(stderr, "mpi_test_main: %s\n", world.status().ToString().c_str());
    return 2;
  }
  const int rank = (*world)->rank();
  if (rank != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new RankFailurePrinter(rank));
  }
  int rc = RUN_ALL_TESTS();
  float failed = rc != 0 ? 1.0f : 0.0f;
  strata::Status s = (*world)->AllReduce(&failed, &failed, 1, strata::DType::kF32, strata::ReduceOp::kSum).Wait();
  if (!s.ok()) {
    std::fprintf(stderr, "[rank %d] mpi_test_main: combining results failed: %s\n", rank, s.ToString().c_str());
    std::fflush(stderr);
    strata::AbortWorld(3);
  }
  if (rank == 0 && failed > 0) std::fprintf(stderr, "mpi_test_main: tests failed on %d rank(s)\n", int(failed));
  world->reset();
  strata::Status f = strata::FinalizeWorld();
  if (!f.ok()) std::fprintf(stderr, "[rank %d] %s\n", rank, f.ToString().c_str());
  return failed > 0 ? 1 : 0;
}
