#!/usr/bin/env bash
# Partial residency on NVMe: `strata bench step` on the 100M MLP at stage 3 with a plane's
# resident fraction at 0, 0.25, 0.5, 0.75 and 1, in interleaved rounds (the disk drifts
# within minutes). PLANE=optimizer (the default): optimizer state and parameters on
# NVMe, strata.optimizer_resident. PLANE=param: the optimizer on the CPU, parameters on
# NVMe, strata.param_resident. Prints one line per run and a table of medians: step
# time, the step-time model's bound and efficiency, NVMe bytes per step, the pinned high
# water, and each step against the 0% one.
#
#   [PLANE=param] bench/partial-residency.sh [ROUNDS] [SWAP_DIR]   # defaults: 3, $TMPDIR/strata-swap
#
# STRATA (the binary, default build/src/strata) and STRATA_BENCH_ARGS (more flags)
# may be set.
set -euo pipefail
rounds=${1:-3}
swap=${2:-${TMPDIR:-/tmp}/strata-swap}
strata=${STRATA:-build/src/strata}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
plane=${PLANE:-optimizer}
case $plane in
  optimizer) offload=(--offload-optimizer nvme --offload-param nvme) ;;
  param) offload=(--offload-optimizer cpu --offload-param nvme) ;;
  *) echo "PLANE must be optimizer or param (got $plane)" >&2; exit 2 ;;
esac
fractions=(0 0.25 0.5 0.75 1)
for f in "${fractions[@]}"; do
  echo "{\"strata\": {\"${plane}_resident\": $f}}" >"$out/f$f.json"
done
for ((r = 1; r <= rounds; r++)); do
  for f in "${fractions[@]}"; do
    # shellcheck disable=SC2086
    "$strata" bench step --params 100M --depth 16 --stage 3 "${offload[@]}" \
      --nvme-path "$swap" --chunk-size 8MiB --device-budget 512MiB --micro-batch 16 --steps 3 \
      --host-budget 3GiB --config "$out/f$f.json" --json ${STRATA_BENCH_ARGS:-} >"$out/r$r-f$f.json"
    python3 - "$out/r$r-f$f.json" "$f" "$r" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
run, m = j["run"], j.get("model_time", {})
print(f"round {sys.argv[3]} resident {sys.argv[2]}: step {run['step_s']*1e3:.0f} ms, "
      f"nvme read {run['bytes']['nvme_read']/2**20:.0f} MiB, write {run['bytes']['nvme_write']/2**20:.0f} MiB, "
      f"bound {m.get('bound_s', 0)*1e3:.0f} ms", flush=True)
PY
  done
done
python3 - "$out" "$rounds" "$plane" "${fractions[@]}" <<'PY'
import json, statistics, sys
out, rounds, plane, fractions = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4:]
rows = {}
for f in fractions:
    runs = [json.load(open(f"{out}/r{r}-f{f}.json")) for r in range(1, rounds + 1)]
    med = lambda get: statistics.median(get(j) for j in runs)
    rows[f] = dict(
        step=med(lambda j: j["run"]["step_s"]),
        bound=med(lambda j: j["model_time"]["bound_s"]),
        eff=med(lambda j: j["overlap_efficiency"]),
        read=med(lambda j: j["run"]["bytes"]["nvme_read"]),
        write=med(lambda j: j["run"]["bytes"]["nvme_write"]),
        host=max(j["run"]["high_water"]["host"] for j in runs),
        resident=runs[0]["model"][f"{plane}_resident_chunks"],
        chunks=runs[0]["model"]["chunks"])
base = rows[fractions[0]]
print("\n| resident | chunks | step (median) | bound | efficiency | NVMe read / write per step | pinned high water | step / 0% step |")
print("|---|---|---|---|---|---|---|---|")
for f in fractions:
    r = rows[f]
    print(f"| {float(f):.0%} | {r['resident']} of {r['chunks']} | {r['step']*1e3:.0f} ms | {r['bound']*1e3:.0f} ms | "
          f"{r['eff']:.2f} | {r['read']/2**20:.0f} / {r['write']/2**20:.0f} MiB | {r['host']/2**20:.0f} MiB | "
          f"{r['step']/base['step']:.2f} |")
PY
