#!/usr/bin/env bash
# GPU check for a machine with an NVIDIA GPU but no package registry (the CUDA toolkit,
# cmake, ninja and a C++ compiler are there; liburing, hwloc, oneTBB, OpenMPI, gtest,
# benchmark, nlohmann-json, CLI11, xxhash are not).
#
#   scripts/fetch-debs.sh                    # beforehand, where a registry is: fills .deb/
#   scripts/device-check.sh OUT_DIR          # on the GPU machine, from the repository root
#
# It unpacks .deb/*.deb with `dpkg -x` into a private prefix (build-gpu/deb-prefix, never /),
# points CMake, pkg-config and the loader at it, builds with CUDA (sm_90) into
# build-gpu, runs the `gpu` tests and the GPU benchmarks, and writes into OUT_DIR:
#   summary.txt      what ran, how long, and each step's exit status
#   *.log            configure, build, ctest and benchmark output
#   *.json           benchmark results (bench-pcie.json, ...)
#   ctest-gpu.xml    JUnit results of the gpu tests
# It aims to finish in under 8 minutes (each step has a time limit; set
# DEVICE_CHECK_JOBS to change build parallelism). Exit status: 0 when every step passed.
# For testing the prefix where the libraries are also installed system-wide:
#   DEVICE_CHECK_STOP_AFTER=configure DEVICE_CHECK_CMAKE_ARGS=-DCMAKE_IGNORE_PREFIX_PATH=/usr \
#   PKG_CONFIG_LIBDIR=/nonexistent STRATA_GPU_BUILD=/tmp/b scripts/device-check.sh /tmp/out
set -uo pipefail
if [[ $# -ne 1 ]]; then
  echo "usage: $0 OUT_DIR" >&2
  exit 2
fi
cd "$(dirname "$0")/.."
root=$PWD
out=$(realpath -m "$1")
mkdir -p "$out"
debs=${STRATA_DEB_DIR:-$root/.deb}
build=${STRATA_GPU_BUILD:-$root/build-gpu}
prefix=${STRATA_DEB_PREFIX:-$build/deb-prefix}  # outside .deb/, so .deb/ stays small to carry
jobs=${DEVICE_CHECK_JOBS:-$(nproc)}
t0=$(date +%s)
status=0
summary=$out/summary.txt
: > "$summary"

note() { echo "$*" | tee -a "$summary"; }
# step NAME LIMIT_SECONDS COMMAND...: runs with a time limit, logs to OUT_DIR/NAME.log.
step() {
  local name=$1 limit=$2
  shift 2
  local s=$(date +%s)
  if declare -F "$1" >/dev/null; then
    "$@" > "$out/$name.log" 2>&1  # a shell function: timeout cannot run it
  else
    timeout --kill-after=10 "$limit" "$@" > "$out/$name.log" 2>&1
  fi
  local rc=$?
  note "$(printf '%-28s rc=%-3s %4ss' "$name" "$rc" "$(($(date +%s) - s))")"
  ((rc != 0)) && status=1
  return $rc
}

note "device-check: $(date -u +%FT%TZ) on $(hostname), $(nproc) cores"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,pci.bus_id,driver_version,memory.total \
  --format=csv,noheader 2>&1 | sed 's/^/gpu: /' | tee -a "$summary"

# 1. The Debian libraries, unpacked into the private prefix.
if ! ls "$debs"/*.deb >/dev/null 2>&1; then
  note "no .deb files in $debs: run scripts/fetch-debs.sh where a package registry is, and carry .deb/ here"
  exit 1
fi
unpack() {
  rm -rf "$prefix" && mkdir -p "$prefix"
  local f
  for f in "$debs"/*.deb; do
    if command -v dpkg-deb >/dev/null; then
      dpkg-deb -x "$f" "$prefix" || return 1
    else  # no dpkg: a .deb is an ar archive holding data.tar.*
      (cd "$prefix" && ar p "$f" "$(ar t "$f" | grep '^data.tar')" | tar -x -a -f - 2>/dev/null ||
        ar p "$f" "$(ar t "$f" | grep '^data.tar')" | xz -dc | tar -x -f -) || return 1
    fi
  done
  # pkg-config files name /usr; make them name the prefix.
  local pc
  for pc in "$prefix"/usr/lib/*/pkgconfig/*.pc "$prefix"/usr/lib/pkgconfig/*.pc "$prefix"/usr/share/pkgconfig/*.pc; do
    [[ -f $pc ]] && sed -i -E "s#^([A-Za-z_]+)=/usr#\1=$prefix/usr#" "$pc"
  done
  # Debian's openmpi points mpicxx at /etc/alternatives; give CMake a direct path.
  ln -sf mpicxx.openmpi "$prefix/usr/bin/mpicxx" 2>/dev/null || true
}
step unpack 120 unpack || exit 1

multiarch=$(ls -d "$prefix"/usr/lib/*-linux-gnu 2>/dev/null | head -1)
export PKG_CONFIG_PATH="$multiarch/pkgconfig:$prefix/usr/share/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
export LD_LIBRARY_PATH="$multiarch:$multiarch/openmpi/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export PATH="$prefix/usr/bin:$PATH"
export OPAL_PREFIX="$prefix/usr"  # relocates OpenMPI's wrappers and help files
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
pkgconfig_exe=$(command -v pkg-config || command -v pkgconf || echo "$prefix/usr/bin/pkgconf")

# 2. Configure and build with CUDA: the strata binary and the gpu tests.
step configure 180 cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DSTRATA_CUDA=ON -DSTRATA_BUILD_BENCH=OFF \
  -DCMAKE_PREFIX_PATH="$prefix/usr" -DPKG_CONFIG_EXECUTABLE="$pkgconfig_exe" \
  -DMPI_CXX_COMPILER="$prefix/usr/bin/mpicxx.openmpi" ${DEVICE_CHECK_CMAKE_ARGS:-} || { note "FAILED: configure"; exit 1; }
if [[ ${DEVICE_CHECK_STOP_AFTER:-} == configure ]]; then note "stopping after configure (DEVICE_CHECK_STOP_AFTER)"; exit $status; fi
gpu_targets=$(ninja -C "$build" -t targets all 2>/dev/null | sed -n 's/^\([A-Za-z0-9_]*_gpu_test\): .*/\1/p' | sort -u)
step build 300 ninja -C "$build" -j "$jobs" strata_cli $gpu_targets || { note "FAILED: build"; exit 1; }

# 3. The gpu tests (skips count as failures here: this machine is supposed to have a GPU).
step ctest-gpu 180 ctest --test-dir "$build" -L gpu --output-on-failure --timeout 120 \
  --output-junit "$out/ctest-gpu.xml"
if grep -q "Skipped" "$out/ctest-gpu.log" 2>/dev/null || grep -q "\[  SKIPPED \]" "$out/ctest-gpu.log" 2>/dev/null; then
  note "WARNING: some gpu tests were skipped (no usable GPU?); see ctest-gpu.log"
  status=1
fi

# 4. GPU benchmarks: JSON on stdout -> NAME.json, messages -> NAME.log. Besides pcie,
# every `strata bench` subcommand that takes --device runs with --device cuda (and
# --quick where it has it); ones that do not exist yet are simply not there.
strata=$build/src/strata
json_step() {  # json_step NAME LIMIT COMMAND...
  local name=$1 limit=$2
  shift 2
  local s=$(date +%s)
  timeout --kill-after=10 "$limit" "$@" > "$out/$name.json" 2> "$out/$name.log"
  local rc=$?
  note "$(printf '%-28s rc=%-3s %4ss' "$name" "$rc" "$(($(date +%s) - s))")"
  ((rc != 0)) && status=1
  return 0
}
json_step info 60 "$strata" info --json
json_step bench-pcie 150 "$strata" bench pcie --device cuda --json
subs=$("$strata" bench --help 2>/dev/null | awk '/^Subcommands:/ {on=1; next} on && /^  [a-z]/ {print $1}')
for sub in $subs; do
  [[ $sub == pcie ]] && continue
  help=$("$strata" bench "$sub" --help 2>/dev/null)
  grep -q -- "--device" <<<"$help" || continue
  extra=()
  grep -q -- "--quick" <<<"$help" && extra+=(--quick)
  grep -q -- "--json" <<<"$help" && extra+=(--json)
  json_step "bench-$sub" 120 "$strata" bench "$sub" --device cuda "${extra[@]}"
done

note "device-check: $(($(date +%s) - t0))s total, status $status"
exit $status
