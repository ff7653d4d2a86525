#!/usr/bin/env bash
# Sets up, builds and runs strata's main job with defaults and no arguments: what this
# machine is (topology, devices, io_uring, limits), the PCIe copy benchmark, and
# `strata train`: a small GPT trained on the fortunes corpus (tokenised into
# $TMPDIR/strata-data on first use) with ZeRO stage 3, optimizer state and parameters
# offloaded to NVMe (a swap directory under $TMPDIR): the progress lines, the validation
# loss falling, and text sampled from the model. The step log goes to
# $TMPDIR/strata-train.jsonl (scripts/plot draws it).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh build >/dev/null
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
./build/src/strata info
./build/src/strata bench pcie --quick
./build/src/strata train --log "${TMPDIR:-/tmp}/strata-train.jsonl"
