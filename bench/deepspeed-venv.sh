#!/usr/bin/env bash
# Makes a scratch venv with DeepSpeed from PyPI, for the peer benchmarks of
# bench/torch-peers.py (docs/benchmarks.md, "strata against DeepSpeed").
#
#   bench/deepspeed-venv.sh [VENV]        (default: /tmp/ds-venv)
#
# The venv is made with Debian's interpreter and its site packages, so that it uses
# Debian's python3-torch (1.13) rather than a torch from PyPI. DeepSpeed is installed
# without its C++ ops (DS_BUILD_OPS=0) and without pip's dependency resolution (which
# would pull a torch 2 wheel): its Python dependencies are named here. Its ops are then
# JIT-built the way a DeepSpeed user gets them (torch.utils.cpp_extension, ninja):
# cpu_adam (DeepSpeedCPUAdam) and async_io (DeepNVMe's aio_handle, needs libaio-dev),
# each in a child process that has to import it; the ops land in the venv's torch
# extensions folder ($VENV/torch_extensions, TORCH_EXTENSIONS_DIR), where the benchmarks
# find them again.
#
# Exits non-zero, saying which step failed and why, where DeepSpeed cannot be installed
# or an op cannot be built. Run heavy steps under `flock /tmp/build.lock` on a shared
# machine (the caller's choice; the script does not take the lock itself).
#
# Environment: DEEPSPEED_VERSION (default below); STRATA_DS_OPS, the ops to build
# (default "cpu_adam async_io"; empty: install only).
set -euo pipefail

venv=${1:-/tmp/ds-venv}
ds_version=${DEEPSPEED_VERSION:-0.15.4}
ops=${STRATA_DS_OPS-cpu_adam async_io}
# DeepSpeed's requirements (requirements/requirements.txt of the version above) less
# torch (Debian's), pinned to versions that work with torch 1.13 and Python 3.11.
deps=(hjson ninja "numpy<2" "packaging>=20.0" psutil py-cpuinfo "pydantic>=2.0.0"
  tqdm nvidia-ml-py msgpack einops)

die() {
  echo "deepspeed-venv: FAILED: $*" >&2
  exit 1
}

[[ -x /usr/bin/python3 ]] || die "no /usr/bin/python3 (Debian's python3)"
/usr/bin/python3 -c 'import torch' 2>/dev/null ||
  die "Debian's python3 cannot import torch: apt-get install python3-torch"
torch_inc=$(/usr/bin/python3 -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "include"))')
# Debian's python3-torch ships torch/include as links into /usr/include, which only
# libtorch-dev fills; DeepSpeed's JIT ops need those headers and pybind11-dev's,
# async_io also libaio.h.
apt_need() { # PACKAGE WHY
  if [[ $(id -u) -eq 0 ]]; then
    echo "deepspeed-venv: installing $1 ($2)"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$1" >/dev/null ||
      die "apt-get install $1 failed ($2)"
  else
    die "$2: apt-get install $1 (as root)"
  fi
}
if [[ -n $ops ]]; then
  [[ -f $torch_inc/torch/extension.h ]] ||
    apt_need libtorch-dev "torch's C++ headers, $torch_inc/torch/extension.h, for DeepSpeed's JIT ops"
  [[ -f $torch_inc/torch/extension.h ]] ||
    die "torch's C++ headers are still missing ($torch_inc/torch/extension.h): DeepSpeed's ops cannot JIT-build"
  # torch's headers include pybind11's, which Debian ships apart.
  [[ -f /usr/include/pybind11/pybind11.h ]] ||
    apt_need pybind11-dev "pybind11's headers, which torch/extension.h includes"
fi
# DeepSpeed's CPU accelerator runs numactl (its CPU setup guide asks for it); ZeRO-3
# with NVMe offload fails without it.
command -v numactl >/dev/null || apt_need numactl "DeepSpeed's CPU accelerator runs numactl"
if [[ " $ops " == *" async_io "* ]] && ! [[ -f /usr/include/libaio.h ]]; then
  apt_need libaio-dev "DeepNVMe's async_io op needs libaio.h"
fi

if ! [[ -x $venv/bin/python ]]; then
  echo "deepspeed-venv: making $venv (Debian's python3, system site packages)"
  /usr/bin/python3 -m venv --system-site-packages "$venv" || die "python3 -m venv $venv"
fi
py=$venv/bin/python
export TORCH_EXTENSIONS_DIR=$venv/torch_extensions

have=$("$py" -c 'from importlib.metadata import version; print(version("deepspeed"))' 2>/dev/null || true)
if [[ $have != "$ds_version" ]]; then
  echo "deepspeed-venv: installing deepspeed==$ds_version and its dependencies from PyPI"
  "$py" -m pip install -q "${deps[@]}" || die "pip install of DeepSpeed's dependencies: ${deps[*]}"
  DS_BUILD_OPS=0 "$py" -m pip install -q --no-deps --no-build-isolation "deepspeed==$ds_version" ||
    die "pip install deepspeed==$ds_version (DS_BUILD_OPS=0, --no-build-isolation) failed"
fi
"$py" -c 'import torch; assert torch.__version__.startswith("1.13"), torch.__version__' ||
  die "the venv does not see Debian's torch 1.13 (a torch from PyPI shadowing it?)"
"$py" -c 'import deepspeed' 2>/tmp/ds-venv-import.log || {
  tail -5 /tmp/ds-venv-import.log >&2
  die "import deepspeed fails with Debian's torch (log: /tmp/ds-venv-import.log)"
}

# DeepSpeed's CPU op builders (op_builder/cpu/builder.py) pass no -std flag and count on
# torch 2's C++17 default; torch 1.13's cpp_extension passes -std=c++14, under which
# cpu_adam's simd.h (std::is_same_v) does not compile, and the CPU async_io builder's
# `args.remove('-std=c++17')` for torch < 2.1 raises. In this scratch venv only, the
# CPU builders' flags get -std=c++17 (async_io then swaps it for -std=c++14 itself).
# Also -DNDEBUG for async_io (below).
"$py" - <<'PATCH' || die "patching DeepSpeed's CPU op builder flags (-std=c++17) failed"
import pathlib, sys, deepspeed.ops.op_builder.cpu.builder as b
p = pathlib.Path(b.__file__)
s = p.read_text()
old = "args = ['-O3', '-g', '-Wno-reorder']"
new = "args = ['-O3', '-std=c++17', '-g', '-Wno-reorder']  # bench/deepspeed-venv.sh: torch 1.13"
if new not in s:
    if old not in s:
        sys.exit(f"{p}: no {old!r} to patch (another DeepSpeed version?)")
    p.write_text(s.replace(old, new))
    print(f"deepspeed-venv: patched {p}: -std=c++17 for torch 1.13")
# The CPU async_io op is built -O0 without -DNDEBUG, so the assert in
# deepspeed_io_handle_t::wait() that some op is pending is live; ZeRO-3's optimizer
# swapper calls wait() after submitting nothing when no tensor is pinned (on the CPU
# accelerator none is: is_pinned() is false without CUDA) and the process aborts.
# -DNDEBUG (as release builds have) lets wait() return 0 there.
p = pathlib.Path(b.__file__).with_name("async_io.py")
s = p.read_text()
old = "args += ['-Wall', '-O0', '-shared', '-fPIC', '-Wno-reorder']"
new = "args += ['-Wall', '-O0', '-DNDEBUG', '-shared', '-fPIC', '-Wno-reorder']  # bench/deepspeed-venv.sh"
if new not in s:
    if old not in s:
        sys.exit(f"{p}: no {old!r} to patch (another DeepSpeed version?)")
    p.write_text(s.replace(old, new))
    print(f"deepspeed-venv: patched {p}: -DNDEBUG")
PATCH

for op in $ops; do
  echo "deepspeed-venv: building DeepSpeed's $op op (JIT; minutes on 2 cores)"
  log=$venv/build-$op.log
  if ! "$py" "$(dirname "$0")/ds_build_op.py" "$op" >"$log" 2>&1; then
    tail -15 "$log" >&2
    die "DeepSpeed's $op op does not build here (full log: $log)"
  fi
done
echo "deepspeed-venv: ok: $("$py" -c 'import deepspeed, torch; print("deepspeed", deepspeed.__version__, "torch", torch.__version__)') in $venv"
