"""Builds one DeepSpeed op by JIT, the way a DeepSpeed user first gets it.

Run by bench/deepspeed-venv.sh and bench/deepspeed-torch2-venv.sh with their venv's
python: `python ds_build_op.py cpu_adam|async_io`. Exits non-zero, saying why, when the
op is not compatible with this machine or does not build.
"""
import sys

from deepspeed.accelerator import get_accelerator
import deepspeed.ops.op_builder as ob

BUILDERS = {"cpu_adam": "CPUAdamBuilder", "async_io": "AsyncIOBuilder"}


def main() -> None:
    if len(sys.argv) != 2 or sys.argv[1] not in BUILDERS:
        sys.exit(f"usage: {sys.argv[0]} {'|'.join(BUILDERS)}")
    name = BUILDERS[sys.argv[1]]
    builder = getattr(ob, name)()
    ok = builder.is_compatible(verbose=True)
    print("accelerator:", get_accelerator().device_name(), "compatible:", ok)
    if not ok:
        sys.exit(f"{name} is not compatible here")
    builder.load(verbose=True)
    print("loaded", name)


if __name__ == "__main__":
    main()
