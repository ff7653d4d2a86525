#!/usr/bin/env bash
# Installs every Debian package that strata's build, tests and benchmarks need, and the
# Python venv of the Python package's build and tests (python/.venv: Debian's python3 and
# python3-torch, plus the pinned python/requirements-dev.txt from PyPI).
# Idempotent: when everything is present it prints nothing and changes nothing.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)

packages=(
  cmake ninja-build g++ make pkg-config git clang-format
  liburing-dev libhwloc-dev hwloc libtbb-dev
  libopenmpi-dev openmpi-bin
  libgtest-dev libgmock-dev libbenchmark-dev
  libdnnl-dev  # oneDNN: the CPU matrix products (STRATA_BLAS=onednn, cmake/StrataBlas.cmake)
  nlohmann-json3-dev libcli11-dev libxxhash-dev
  libpcre2-dev  # PCRE2: GPT-2's BPE pre-tokenisation pattern (src/model/bpe.cc)
  fio python3
  python3-dev python3-venv python3-torch python3-matplotlib
  libopenblas0-pthread  # the libblas.so.3 that the PyTorch peer's products use (docs/benchmarks.md)
  fortunes fortunes-min  # the default text corpus of `strata data prepare`
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

install_debs() {
  ((${#missing[@]} == 0)) && return 0
  echo "setup: installing ${missing[*]}"
  local sudo_cmd=()
  if [[ $(id -u) -ne 0 ]]; then
    if command -v sudo >/dev/null; then
      sudo_cmd=(sudo)
    else
      echo "setup: need root (or sudo) to install: ${missing[*]}" >&2
      exit 1
    fi
  fi
  export DEBIAN_FRONTEND=noninteractive
  "${sudo_cmd[@]}" apt-get update -qq
  "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  echo "setup: done"
}

# The venv is made with Debian's interpreter (/usr/bin/python3, not whatever python3 is
# first on PATH), with its site packages, so that Debian's torch is importable in it.
setup_venv() {
  local venv=$root/python/.venv reqs=$root/python/requirements-dev.txt
  local check='import sys
from importlib.metadata import PackageNotFoundError, version
for line in open(sys.argv[1]):
    name, sep, want = line.split("#")[0].strip().partition("==")
    if not sep:
        continue
    try:
        ok = version(name) == want
    except PackageNotFoundError:
        ok = False
    if not ok:
        sys.exit(1)'
  if [[ -x $venv/bin/python ]] && "$venv/bin/python" -c "$check" "$reqs" 2>/dev/null; then
    return 0
  fi
  echo "setup: making the Python venv $venv"
  [[ -x $venv/bin/python ]] || /usr/bin/python3 -m venv --system-site-packages "$venv"
  "$venv/bin/python" -m pip install -q -r "$reqs"
  echo "setup: venv done"
}

install_debs
setup_venv
