#!/usr/bin/env bash
# Sets up, builds and runs strata's main job with defaults: what this machine is
# (topology, devices, io_uring, limits) and the offload-bandwidth benchmarks.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh build >/dev/null
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
./build/src/strata info
./build/src/strata bench pcie --quick
