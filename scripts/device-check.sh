#!/usr/bin/env bash
# GPU check for a machine with an NVIDIA GPU but no package registry (the CUDA toolkit,
# cmake, ninja and a C++ compiler are there; liburing, hwloc, oneTBB, OpenMPI, gtest,
# nlohmann-json, CLI11, xxhash are not; NCCL may or may not be).
#
#   scripts/fetch-debs.sh                    # beforehand, where a registry is: fills .deb/
#   scripts/device-check.sh OUT_DIR          # on the GPU machine, from the repository root
#
# One command, made to fit one device lease (at most 600 s a command) from a clean
# checkout: a global deadline (DEVICE_CHECK_DEADLINE_S, default 420 s from the start)
# caps every step's time limit, and whatever is left when it passes is skipped and named
# as skipped. In order:
#   1. unpack .deb/*.deb with `dpkg -x` into a private prefix (build-gpu/deb-prefix, never /)
#      and point CMake, pkg-config and the loader at it;
#   2. configure with CUDA (sm_90; NCCL when found) and build, in parallel, only the
#      strata binary and the *_gpu_test programs;
#   3. the `gpu` tests (ctest -L gpu);
#   4. the GPU benchmarks: `strata info`, PCIe pinned and pageable (`strata bench pcie`),
#      GPU Adam beside a device-to-device copy (HBM), the cuBLAS GEMM peak and the MLP
#      step against it, without offload and with NVMe offload (device_bench_gpu_test),
#      the GPT job on the GPU (`strata train --device cuda`: ZeRO-3, both offloads on
#      NVMe, 40 steps on token files of the repository's docs), then every other
#      `strata bench` subcommand that takes --device.
# OUT_DIR receives summary.txt and summary.json (every step: state, exit status, seconds,
# limit; what was skipped and why), a .log per step, ctest-gpu.xml (JUnit) and the
# benchmarks' .json files. Exit status: 0 when every step that ran passed and nothing
# was skipped for the deadline.
#
# STRATA_DEVICE_CHECK_DRY=1: the same run without the GPU parts (for a machine without a
# GPU, to time the CPU part): everything is unpacked, configured and built, the gpu tests
# run (and skip), `strata info` runs, and the GPU benchmarks are listed as skipped.
# Other knobs: DEVICE_CHECK_JOBS (build parallelism, default nproc),
# DEVICE_CHECK_TEST_JOBS (ctest parallelism, default 4), DEVICE_CHECK_DEADLINE_S,
# DEVICE_CHECK_BUILD_LIMIT_S (default 300; both larger to time a slow machine's build),
# DEVICE_CHECK_CMAKE_ARGS,
# DEVICE_CHECK_STOP_AFTER=configure, STRATA_GPU_BUILD (build folder), STRATA_DEB_DIR.
# For testing the prefix where the libraries are also installed system-wide:
#   DEVICE_CHECK_CMAKE_ARGS=-DCMAKE_IGNORE_PREFIX_PATH=/usr PKG_CONFIG_LIBDIR=/nonexistent \
#   STRATA_DEVICE_CHECK_DRY=1 STRATA_GPU_BUILD=/tmp/b scripts/device-check.sh /tmp/out
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
test_jobs=${DEVICE_CHECK_TEST_JOBS:-4}
dry=${STRATA_DEVICE_CHECK_DRY:-0}
t0=$(date +%s)
deadline=$((t0 + ${DEVICE_CHECK_DEADLINE_S:-420}))
reserve=15  # seconds kept for the summary (and a step's --kill-after)
status=0
summary=$out/summary.txt
steps_json=()
skipped=()
recorded=()
# Every step, in order: one that is not reached (a required step failed) is listed as
# skipped with the reason.
plan=(unpack configure build ctest-gpu info bench-pcie bench-hbm-adam bench-mlp-step gpt-data
      train-gpt-cuda bench-cli-others)
fatal_reason=""
: > "$summary"

note() { echo "$*" | tee -a "$summary"; }
json_str() {  # a JSON string literal of $1
  local s=${1//\\/\\\\}
  s=${s//\"/\\\"}
  s=${s//$'\n'/ }
  s=${s//$'\t'/ }
  printf '"%s"' "$s"
}
# Sets cpu to the CPU seconds (user + system) used so far by this script's finished
# children: with the wall time it tells how a step would scale to more cores. `times`
# must run in this shell (a subshell starts from zero), so its output goes to a file.
cpu=0
cpu_now() {
  times > "$out/.times"
  cpu=$(awk 'END { n = split($0, f, " "); t = 0
    for (i = 1; i <= n; ++i) { m = f[i]; sub(/m.*/, "", m); x = f[i]; sub(/^[0-9]+m/, "", x); sub(/s$/, "", x)
      t += m * 60 + x }
    printf "%.0f", t }' "$out/.times")
}
step_cpu0=0
record() {  # record NAME STATE RC SECONDS LIMIT NOTE
  cpu_now
  cpu=$((cpu - step_cpu0))
  recorded+=("$1")
  steps_json+=("{\"name\": $(json_str "$1"), \"state\": \"$2\", \"rc\": $3, \"seconds\": $4, \"cpu_s\": $cpu, \"limit_s\": $5, \"note\": $(json_str "$6")}")
  note "$(printf '%-26s %-8s rc=%-4s %4ss cpu %5ss (limit %ss) %s' "$1" "$2" "$3" "$4" "$cpu" "$5" "$6")"
  cpu_now
  step_cpu0=$cpu
}
skip() {  # skip NAME REASON
  skipped+=("$1")
  cpu_now
  step_cpu0=$cpu
  record "$1" skipped null 0 0 "$2"
}
# The time a step may take: its own limit, capped by what is left before the deadline;
# 0 when less than `need` seconds are left.
budget() {
  local limit=$1 need=${2:-10} left=$((deadline - reserve - $(date +%s)))
  ((left < need)) && { echo 0; return; }
  echo $((limit < left ? limit : left))
}
# step NAME LIMIT COMMAND...: runs with a time limit (capped by the deadline), output to
# OUT_DIR/NAME.log. Returns the command's status; a step the deadline left no time for
# is skipped (status 124).
step() {
  local name=$1 limit
  limit=$(budget "$2")
  shift 2
  if ((limit == 0)); then
    skip "$name" "deadline: less than 10 s left"
    status=1
    return 124
  fi
  local s=$(date +%s) rc state=ok
  if declare -F "$1" >/dev/null; then
    export -f "$1"  # timeout runs programs: a shell function runs in a child bash
    timeout --kill-after=10 "$limit" bash -c '"$@"' _ "$@" > "$out/$name.log" 2>&1
  else
    timeout --kill-after=10 "$limit" "$@" > "$out/$name.log" 2>&1
  fi
  rc=$?
  ((rc == 124 || rc == 137)) && state=timeout
  ((rc != 0 && rc != 124 && rc != 137)) && state=failed
  record "$name" "$state" "$rc" "$(($(date +%s) - s))" "$limit" "${STEP_NOTE:-}"
  STEP_NOTE=
  ((rc != 0)) && status=1
  return $rc
}
fatal() {  # fatal REASON: a required step failed; the rest is not reached
  fatal_reason=$1
  note "FAILED: $1"
  status=1
  finish
}
finish() {
  local p
  for p in "${plan[@]}"; do
    [[ " ${recorded[*]+${recorded[*]}} " == *" $p "* ]] || skip "$p" "not reached: ${fatal_reason:-stopped early}"
  done
  local total=$(($(date +%s) - t0)) skipped_json="" s
  cpu_now
  local total_cpu=$cpu
  rm -f "$out/.times"
  for s in "${skipped[@]+"${skipped[@]}"}"; do skipped_json+="${skipped_json:+, }$(json_str "$s")"; done
  local steps="" j
  for j in "${steps_json[@]+"${steps_json[@]}"}"; do steps+="${steps:+,
    }$j"; done
  cat > "$out/summary.json" <<EOF
{
  "tool": "scripts/device-check.sh",
  "started": "$(date -u -d "@$t0" +%FT%TZ)",
  "host": $(json_str "$(hostname)"),
  "cores": $(nproc),
  "gpu": $(json_str "${gpu_line:-none}"),
  "dry_run": $([[ $dry == 1 ]] && echo true || echo false),
  "nccl": $(json_str "${nccl_state:-unknown}"),
  "deadline_s": $((deadline - t0)),
  "total_s": $total,
  "cpu_s": $total_cpu,
  "status": $status,
  "skipped": [${skipped_json}],
  "steps": [
    ${steps}
  ]
}
EOF
  note "device-check: ${total}s total, ${total_cpu}s cpu (deadline $((deadline - t0))s), status $status${skipped[*]+, skipped: ${skipped[*]}}"
  exit $status
}

note "device-check: $(date -u +%FT%TZ) on $(hostname), $(nproc) cores, deadline $((deadline - t0))s$([[ $dry == 1 ]] && echo ', DRY RUN (no GPU parts)')"
gpu_line=$(nvidia-smi --query-gpu=name,pci.bus_id,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -1)
note "gpu: ${gpu_line:-none found by nvidia-smi}"

# 1. The Debian libraries, unpacked into the private prefix.
if ! ls "$debs"/*.deb >/dev/null 2>&1; then
  fatal "no .deb files in $debs: run scripts/fetch-debs.sh where a package registry is, and carry .deb/ here"
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
export prefix debs
step unpack 60 unpack || fatal "unpack"

multiarch=$(ls -d "$prefix"/usr/lib/*-linux-gnu 2>/dev/null | head -1)
export PKG_CONFIG_PATH="$multiarch/pkgconfig:$prefix/usr/share/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
export LD_LIBRARY_PATH="$multiarch:$multiarch/openmpi/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export PATH="$prefix/usr/bin:$PATH"
export OPAL_PREFIX="$prefix/usr"  # relocates OpenMPI's wrappers and help files
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
pkgconfig_exe=$(command -v pkg-config || command -v pkgconf || echo "$prefix/usr/bin/pkgconf")

# 2. Configure and build with CUDA: the strata binary and the gpu tests. Optimised as the
# default build (-O2) but without debug information, which only costs compile and link
# time here. NCCL is optional: without it the one-GPU paths build and run, and the NCCL
# test checks the "built without NCCL" refusal instead. The CPU matrix products use the
# built-in kernel (STRATA_BLAS=none): oneDNN and the OpenCL loader it needs are not among
# the carried .debs, and the GPU checks compare against CPU kernels, not against oneDNN.
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
step configure 90 cmake -S "$root" -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O2 -DNDEBUG" -DCMAKE_CUDA_FLAGS_RELWITHDEBINFO="-O2 -DNDEBUG" \
  -DSTRATA_CUDA=ON -DSTRATA_NCCL=AUTO -DSTRATA_BUILD_BENCH=OFF -DSTRATA_BLAS=none \
  -DCMAKE_PREFIX_PATH="$prefix/usr" -DPKG_CONFIG_EXECUTABLE="$pkgconfig_exe" \
  -DMPI_CXX_COMPILER="$prefix/usr/bin/mpicxx.openmpi" ${DEVICE_CHECK_CMAKE_ARGS:-} || fatal "configure"
if grep -q "strata: NCCL not found\|STRATA_NCCL=OFF" "$out/configure.log"; then nccl_state=absent; else nccl_state=found; fi
note "nccl: $nccl_state"
if [[ ${DEVICE_CHECK_STOP_AFTER:-} == configure ]]; then
  fatal_reason="DEVICE_CHECK_STOP_AFTER=configure"
  finish
fi
gpu_targets=$(for f in "$root"/tests/*/*_gpu_test.cc; do basename "$f" .cc; done | sort -u)
STEP_NOTE="strata_cli $(echo $gpu_targets), -j $jobs"
step build "${DEVICE_CHECK_BUILD_LIMIT_S:-300}" cmake --build "$build" -j "$jobs" --target strata_cli $gpu_targets || fatal "build (see build.log)"

# 3. The gpu tests. On the GPU machine a skipped test counts as a failure (it is supposed
# to have a GPU); in a dry run every one of them skips, and that is the expected result.
# Without NCCL the collectives' tests cannot run (they would skip); NcclBuild checks the
# refusal instead.
exclude=()
[[ $nccl_state == absent ]] && exclude=(-E '^NcclTest\.')
STEP_NOTE="ctest -L gpu -j $test_jobs ${exclude[*]}"
step ctest-gpu 180 ctest --test-dir "$build" -L gpu "${exclude[@]}" -j "$test_jobs" --output-on-failure \
  --timeout 120 --output-junit "$out/ctest-gpu.xml"
skips=$(grep -c '\*\*\*Skipped' "$out/ctest-gpu.log" 2>/dev/null)
if [[ $dry != 1 && ${skips:-0} -gt 0 ]]; then
  note "WARNING: ${skips} gpu tests were skipped (no usable GPU?); see ctest-gpu.log"
  status=1
fi
[[ $dry == 1 ]] && note "dry run: ${skips:-0} gpu tests skipped, as expected without a GPU"

# 4. The benchmarks: JSON on stdout -> NAME.json, messages -> NAME.log.
strata=$build/src/strata
json_step() {  # json_step NAME LIMIT COMMAND...
  local name=$1 limit
  limit=$(budget "$2")
  shift 2
  if ((limit == 0)); then skip "$name" "deadline: less than 10 s left"; status=1; return 0; fi
  local s=$(date +%s) rc state=ok
  timeout --kill-after=10 "$limit" "$@" > "$out/$name.json" 2> "$out/$name.log"
  rc=$?
  ((rc == 124 || rc == 137)) && state=timeout
  ((rc != 0 && rc != 124 && rc != 137)) && state=failed
  record "$name" "$state" "$rc" "$(($(date +%s) - s))" "$limit" ""
  ((rc != 0)) && status=1
  return 0
}
json_step info 30 "$strata" info --json

bench_bin=$build/tests/device_bench_gpu_test
gpu_benches=(bench-pcie bench-hbm-adam bench-mlp-step)
if [[ $dry == 1 ]]; then
  # Without a GPU: that the benchmark programs start and find their benchmarks.
  step bench-list 30 "$bench_bin" --gtest_also_run_disabled_tests --gtest_list_tests --gtest_filter='DeviceBench.*'
  step strata-bench-help 30 "$strata" bench pcie --help
  for b in "${gpu_benches[@]}" gpt-data train-gpt-cuda bench-cli-others; do skip "$b" "dry run: needs the GPU"; done
  finish
fi
json_step bench-pcie 45 "$strata" bench pcie --device cuda --quick --json
# The C++ benchmarks write bench-<name>.json into OUT_DIR themselves.
bench_run() {  # bench_run NAME FILTER LIMIT
  local name=$1 filter=$2 limit
  limit=$(budget "$3")
  if ((limit == 0)); then skip "$name" "deadline: less than 10 s left"; status=1; return 0; fi
  local s=$(date +%s) rc state=ok
  STRATA_BENCH_OUT=$out STRATA_BENCH_SWAP=$build/bench-swap timeout --kill-after=10 "$limit" "$bench_bin" \
    --gtest_also_run_disabled_tests --gtest_filter="$filter" > "$out/$name.log" 2>&1
  rc=$?
  ((rc == 124 || rc == 137)) && state=timeout
  ((rc != 0 && rc != 124 && rc != 137)) && state=failed
  # A benchmark that skipped (no usable GPU) measured nothing: a failure here.
  if ((rc == 0)) && grep -q '^\[  SKIPPED \]' "$out/$name.log"; then state=skipped-by-test rc=1; fi
  record "$name" "$state" "$rc" "$(($(date +%s) - s))" "$limit" "$(grep -o '^BENCH .*' "$out/$name.log" | head -c 300)"
  ((rc != 0)) && status=1
  return 0
}
bench_run bench-hbm-adam 'DeviceBench.DISABLED_AdamBesideHbmCopy' 60
bench_run bench-mlp-step 'DeviceBench.DISABLED_MlpStepBesideGemmPeak' 150

# The GPT job end to end on the GPU (the driver's CUDA kernels on the engine's stream),
# ZeRO-3 with both offloads on NVMe, on the repository's own text (the device machine
# need not have the fortunes corpus). train-gpt-cuda.json holds the validation losses
# before the first step, at step 20 and after the last, and the tokens per second.
gpt_data=$build/gpt-data
if step gpt-data 30 "$strata" data prepare "$root"/docs/*.md "$root"/README.md --out "$gpt_data"; then
  json_step train-gpt-cuda 90 "$strata" train --device cuda --data "$gpt_data" --steps 40 --eval-every 20 \
    --stage 3 --offload-optimizer nvme --offload-param nvme --nvme-path "$build/bench-swap" --json
else
  skip train-gpt-cuda "the token files could not be prepared (see gpt-data.log)"
  status=1
fi

# Every other `strata bench` subcommand that takes --device runs with --device cuda (and
# --quick / --json where it has them); ones that do not exist yet are simply not there.
subs=$("$strata" bench --help 2>/dev/null | awk '/^Subcommands:/ {on=1; next} on && /^  [a-z]/ {print $1}')
for sub in $subs; do
  [[ $sub == pcie ]] && continue
  help=$("$strata" bench "$sub" --help 2>/dev/null)
  grep -q -- "--device" <<<"$help" || continue
  extra=()
  grep -q -- "--quick" <<<"$help" && extra+=(--quick)
  grep -q -- "--json" <<<"$help" && extra+=(--json)
  grep -q -- "--nvme-path" <<<"$help" && extra+=(--nvme-path "$build/bench-swap")
  json_step "bench-$sub" 90 "$strata" bench "$sub" --device cuda "${extra[@]}"
done
recorded+=(bench-cli-others)
finish
