#!/usr/bin/env bash
# Makes a scratch venv with torch 2 and DeepSpeed from PyPI, for the ZeRO-3 NVMe rows of
# bench/torch-peers.py (docs/benchmarks.md, "strata's Python package against PyTorch and
# DeepSpeed"), which bench/deepspeed-venv.sh's torch 1.13 venv cannot run: DeepSpeed before
# 0.19 asks its CPU accelerator whether a swap buffer is pinned, which no CPU tensor is, and
# DeepSpeed 0.19 needs torch 2.
#
#   bench/deepspeed-torch2-venv.sh [VENV]        (default: /tmp/ds2-venv)
#   flock /tmp/build.lock VENV/bin/python bench/torch-peers.py step --swap /work/strata-swap
#
# Both sides of a row run on this venv's torch: strata's module (build/python, which
# bench/torch-peers.py puts on the path) does not link torch, so the repository's build
# imports here as it does under Debian's torch 1.13.
#
# The venv is made with Debian's interpreter (the one build/python's module is built for)
# WITHOUT its site packages, so that Debian's python3-torch 1.13 is not seen. PyPI has no
# CPU-only torch for Linux x86_64: its torch 2.11.0 wheel (506 MiB) is the CUDA 13.0 build,
# whose libraries load the CUDA runtime libraries at import even where no GPU is. On this
# machine the CUDA 13.0 toolkit provides them (ldconfig); the three it lacks come from PyPI
# with --no-deps (nvidia-cufile 1.2 MiB, nvidia-cusparselt-cu13 162 MiB,
# nvidia-nvshmem-cu13 58 MiB): about 730 MiB of downloads in all, instead of all the CUDA
# wheels pip's resolver would fetch (pip then lists them as missing requirements of torch:
# expected). torch 2.11.0 is the release whose CUDA
# dependencies (cuda-toolkit 13.0.2, NCCL 2.28.9) match that toolkit. DeepSpeed is installed
# without its C++ ops (DS_BUILD_OPS=0, --no-build-isolation, --no-deps, its Python
# dependencies named here); cpu_adam and async_io (with pin_memory, which async_io loads
# first) are then JIT-built the way a DeepSpeed user gets them, into $VENV/torch_extensions,
# where the benchmark finds them again.
#
# One patch, to this venv's DeepSpeed only (below, with its reason). Exits non-zero, saying
# which step failed and why, where any step fails. Run it under `flock /tmp/build.lock` on
# a shared machine (the op builds take minutes of both cores).
#
# Environment: TORCH_VERSION, DEEPSPEED_VERSION (defaults below; another pair may need
# other CUDA libraries or patches); STRATA_DS_OPS, the ops to build (default
# "cpu_adam async_io"; empty: install only).
set -euo pipefail

venv=${1:-/tmp/ds2-venv}
torch_version=${TORCH_VERSION:-2.11.0}
ds_version=${DEEPSPEED_VERSION:-0.19.8}
ops=${STRATA_DS_OPS-cpu_adam async_io}
# torch 2.11.0's own requirements less its CUDA wheels and triton (not needed on the CPU).
torch_deps=(filelock "typing-extensions>=4.10.0" "setuptools<82" "sympy>=1.13.3" "networkx>=2.5.1"
  jinja2 "fsspec>=0.8.5")
# The CUDA libraries torch 2.11.0's libraries need at import that the CUDA 13.0 toolkit
# does not ship, at the versions torch 2.11.0 names (cuda-toolkit 13.0.2's cufile).
cuda_wheels=(nvidia-cufile==1.15.1.6 nvidia-cusparselt-cu13==0.8.0 nvidia-nvshmem-cu13==3.4.5)
# The ones it needs from the system: SONAMEs that libtorch*.so name (readelf -d).
system_cuda=(libcudart.so.13 libcublas.so.13 libcublasLt.so.13 libcufft.so.12 libcurand.so.10
  libcusparse.so.12 libcusolver.so.12 libcupti.so.13 libnvrtc.so.13 libnvJitLink.so.13
  libcudnn.so.9 libnccl.so.2)
# DeepSpeed's requirements (requirements/requirements.txt of 0.19.8) less torch.
ds_deps=(einops hjson msgpack ninja numpy "packaging>=20.0" psutil py-cpuinfo "pydantic>=2.0.0" tqdm)

die() {
  echo "deepspeed-torch2-venv: FAILED: $*" >&2
  exit 1
}

[[ -x /usr/bin/python3 ]] || die "no /usr/bin/python3 (Debian's python3)"
missing=()
cache=$(ldconfig -p)
for lib in "${system_cuda[@]}"; do
  grep -q "^[[:space:]]*$lib " <<<"$cache" || missing+=("$lib")
done
((${#missing[@]} == 0)) ||
  die "torch $torch_version's PyPI wheel (the CUDA 13.0 build; PyPI has no CPU-only torch for Linux) loads" \
    "${missing[*]} at import, and ldconfig does not find them: install the CUDA 13.0 toolkit, or" \
    "pip install torch==$torch_version with its CUDA wheels (cuDNN, cuBLAS, NCCL, ...: GBs)"
apt_need() { # PACKAGE WHY
  if [[ $(id -u) -eq 0 ]]; then
    echo "deepspeed-torch2-venv: installing $1 ($2)"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$1" >/dev/null ||
      die "apt-get install $1 failed ($2)"
  else
    die "$2: apt-get install $1 (as root)"
  fi
}
# DeepSpeed's CPU accelerator runs numactl (its CPU setup guide asks for it).
command -v numactl >/dev/null || apt_need numactl "DeepSpeed's CPU accelerator runs numactl"
if [[ " $ops " == *" async_io "* ]] && ! [[ -f /usr/include/libaio.h ]]; then
  apt_need libaio-dev "DeepNVMe's async_io op needs libaio.h"
fi

if ! [[ -x $venv/bin/python ]]; then
  echo "deepspeed-torch2-venv: making $venv (Debian's python3, without its site packages)"
  /usr/bin/python3 -m venv "$venv" || die "python3 -m venv $venv"
fi
py=$venv/bin/python
export TORCH_EXTENSIONS_DIR=$venv/torch_extensions

have=$("$py" -c 'from importlib.metadata import version; print(version("torch"))' 2>/dev/null || true)
if [[ $have != "$torch_version"* ]]; then
  echo "deepspeed-torch2-venv: installing torch==$torch_version (506 MiB) and ${cuda_wheels[*]} from PyPI, --no-deps"
  "$py" -m pip install -q --no-deps "torch==$torch_version" "${cuda_wheels[@]}" ||
    die "pip install --no-deps torch==$torch_version ${cuda_wheels[*]}"
  "$py" -m pip install -q "${torch_deps[@]}" || die "pip install of torch's dependencies: ${torch_deps[*]}"
fi
"$py" -c "import torch; assert torch.__version__.startswith('$torch_version'), torch.__version__" \
  2>/tmp/ds2-venv-torch.log || {
  tail -5 /tmp/ds2-venv-torch.log >&2
  die "import torch fails in $venv (log: /tmp/ds2-venv-torch.log)"
}

have=$("$py" -c 'from importlib.metadata import version; print(version("deepspeed"))' 2>/dev/null || true)
if [[ $have != "$ds_version" ]]; then
  echo "deepspeed-torch2-venv: installing deepspeed==$ds_version and its dependencies from PyPI"
  "$py" -m pip install -q "${ds_deps[@]}" wheel || die "pip install of DeepSpeed's dependencies: ${ds_deps[*]}"
  DS_BUILD_OPS=0 "$py" -m pip install -q --no-deps --no-build-isolation "deepspeed==$ds_version" ||
    die "pip install deepspeed==$ds_version (DS_BUILD_OPS=0, --no-build-isolation) failed"
fi
"$py" -c 'import deepspeed' 2>/tmp/ds2-venv-import.log || {
  tail -5 /tmp/ds2-venv-import.log >&2
  die "import deepspeed fails with torch $torch_version (log: /tmp/ds2-venv-import.log)"
}

# DeepSpeed's ZeRO-3 Init._set_dtype, given the model's dtype (as deepspeed.initialize
# gives it, float32 here), reads
#     self.dtype = dtype or torch.float16 if acc.is_fp16_supported() else torch.bfloat16 if acc.is_bf16_supported else torch.float32
# which Python groups as (dtype or float16) if is_fp16_supported() else (...), and
# is_bf16_supported is not called, so it is always true. On a GPU is_fp16_supported() is
# true and the model's dtype wins; on the CPU accelerator (no AVX512-FP16 here) the result
# is bfloat16 for an fp32 model: the NVMe parameter swapper is then made for bf16, the
# parameters it takes at initialize (>= 1 MiB in bf16: the embedding and the head of the
# benchmark's model) are rounded to bf16 once (max error 0.0156 on the embedding, checked
# against the model built), and fp32 tensors of 1 MiB are not swappable. The patch adds the
# parentheses and the call; bench/torch_peers/step.py checks that the swapper is fp32.
# (bench/deepspeed-venv.sh's patches for 0.15.4 are not needed here: torch 2 compiles the
# ops as C++17, and ZeRO-3's swappers submit their locked buffers, so async_io's wait()
# assert holds without -DNDEBUG.)
"$py" - <<'PATCH' || die "patching DeepSpeed's Init._set_dtype failed"
import pathlib, sys, deepspeed.runtime.zero.partition_parameters as m
p = pathlib.Path(m.__file__)
s = p.read_text()
old = """            self.dtype = dtype or torch.float16 if get_accelerator().is_fp16_supported(
            ) else torch.bfloat16 if get_accelerator().is_bf16_supported else torch.float32
"""
new = """            # bench/deepspeed-torch2-venv.sh: parenthesised, and is_bf16_supported called
            self.dtype = dtype or (torch.float16 if get_accelerator().is_fp16_supported(
            ) else torch.bfloat16 if get_accelerator().is_bf16_supported() else torch.float32)
"""
if new not in s:
    if old not in s:
        sys.exit(f"{p}: no Init._set_dtype line to patch (another DeepSpeed version?)")
    p.write_text(s.replace(old, new))
    print(f"deepspeed-torch2-venv: patched {p}: Init._set_dtype keeps the model's dtype")
PATCH

for op in $ops; do
  echo "deepspeed-torch2-venv: building DeepSpeed's $op op (JIT; minutes on 2 cores)"
  log=$venv/build-$op.log
  if ! "$py" "$(dirname "$0")/ds_build_op.py" "$op" >"$log" 2>&1; then
    tail -15 "$log" >&2
    die "DeepSpeed's $op op does not build here (full log: $log)"
  fi
done
echo "deepspeed-torch2-venv: ok: $("$py" -c 'import deepspeed, torch; print("deepspeed", deepspeed.__version__, "torch", torch.__version__)' 2>/dev/null | tail -1) in $venv"
