#!/usr/bin/env bash
# Sets up, builds and runs every test: the normal build (with CUDA where the toolkit
# is installed, so GPU code always compiles), then once more under AddressSanitizer
# and UndefinedBehaviorSanitizer. GPU tests skip with a message where no GPU is
# present; ctest reports them as skipped, not passed.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
jobs=$(nproc)

# Both builds carry line tables only (-g1): backtraces still name file and line, and
# each build takes about a quarter less time than with full debug info. For gdb, build
# a folder of your own with scripts/build.sh (full -g).
echo "== build (release, CUDA=${STRATA_CUDA:-AUTO})"
scripts/build.sh build -DSTRATA_CUDA="${STRATA_CUDA:-AUTO}" -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O2 -g1 -DNDEBUG"
echo "== tests"
(cd build && ctest --output-on-failure -j "$jobs" --timeout 600)

if [[ "${STRATA_SKIP_SANITIZE:-0}" != 1 ]]; then
  echo "== build (AddressSanitizer + UBSan)"
  # The tests only: no CUDA (it cannot run here and is compiled above), no benchmarks,
  # no CLI binary; -O1 keeps the sanitized tests fast. The engine's GPU test programs
  # are left out: without CUDA each test in them only skips, and they are the slowest
  # to compile (the build above compiles them against CUDA and runs them). The other
  # GPU programs stay: some of their tests check the refusals of a build without CUDA.
  scripts/build.sh build-asan -DSTRATA_SANITIZE=ON -DSTRATA_CUDA=OFF -DSTRATA_BUILD_BENCH=OFF \
    -DSTRATA_BUILD_CLI=OFF -DSTRATA_TEST_EXCLUDE='^(engine_.*|device_bench)_gpu_test$' \
    -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS_DEBUG="-O1 -g1"
  echo "== tests under sanitizers"
  # LeakSanitizer reports allocations of plugins that OpenMPI and hwloc dlopen and
  # unload again (their frames show as "<unknown module>", so no suppression can name
  # them). Tests that start MPI or discover the topology run with leak checking off;
  # every other test runs with it on. Address and UB checks stay on everywhere.
  no_leak_check='^(Topology|World|Nccl|NcclBuild|Engine|EngineTimeline|EngineFault|EngineBudget|EngineCorruption|EngineGolden|EngineModel|EngineGpt|EngineCheckpoint|EngineCheckpointGpu|EngineLr|EngineResidency|EngineParamResidency|EngineParamDevice|EngineStream|StepBenchRun|EnginePlan|Planner|SafetensorsPlanModelTest|TrafficTest|Combos/TrafficTest)\.'
  (cd build-asan && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
     ctest --output-on-failure -j "$jobs" --timeout 900 -LE mpi -E "$no_leak_check")
  (cd build-asan && ASAN_OPTIONS=detect_leaks=0 UBSAN_OPTIONS=print_stacktrace=1 \
     ctest --output-on-failure -j "$jobs" --timeout 900 -LE mpi -R "$no_leak_check")
  # Two ranks exercise every sharded path under the sanitizers; four ranks run in the
  # release pass above, and would add a minute of serial runs here.
  (cd build-asan && ASAN_OPTIONS=detect_leaks=0 UBSAN_OPTIONS=print_stacktrace=1 \
     ctest --output-on-failure --timeout 900 -L mpi -R '_np2$')
fi
echo "== all tests passed"
