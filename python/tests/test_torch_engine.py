"""strata.torch.initialize against plain torch training (AdamW over the global batch)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import strata.torch as st
from torch_engine_model import batches, config, loss_of, make_models, train_reference

# fp32 on both sides; the engine's SIMD Adam and torch's differ in rounding order only:
# ~1e-7 per step on parameters of order 0.1-1, so 1e-5 over a few steps is ample and
# still three orders below one step's change (lr 0.01).
ATOL = 1e-5


def train_engine(engine, data, rank: int = 0, world: int = 1):
    losses = []
    for micro_batches in data:
        total = 0.0
        for x, y in micro_batches:
            share = x.shape[0] // world
            xs, ys = x[rank * share:(rank + 1) * share], y[rank * share:(rank + 1) * share]
            loss = loss_of(engine(xs), ys)
            engine.backward(loss)
            total += float(loss) / len(micro_batches)
        engine.step()
        losses.append(total)
    return losses


@pytest.mark.parametrize("stage,offload,param", [
    (0, "none", "none"), (1, "none", "none"), (1, "cpu", "none"), (2, "none", "none"), (2, "cpu", "none"),
    (3, "none", "none"), (3, "cpu", "cpu"), (3, "nvme", "nvme"), (3, "nvme", "cpu"), (3, "cpu", "nvme")])
def test_every_stage_matches_torch_adamw_with_a_tied_weight(stage: int, offload: str, param: str, io_dir) -> None:
    model, ref = make_models()
    data = batches(steps=3, micro=1, global_batch=8)
    engine = st.initialize(model, config(stage, offload, param=param, nvme_path=str(io_dir)))
    try:
        losses = train_engine(engine, data)
        ref_losses = train_reference(ref, data)
        assert losses == pytest.approx(ref_losses, rel=1e-5)
        ref_params = [ref.emb.weight, ref.mid.weight, ref.mid.bias, ref.out.weight, ref.out.bias]
        masters = engine.master_params()
        assert len(masters) == len(ref_params), "the tied weight is one parameter"
        for got, want in zip(masters, ref_params):
            assert (got - want.detach()).abs().max().item() < ATOL
        if stage < 3:  # the parameters are the engine's compute copies
            assert (model.mid.weight.detach() - masters[1]).abs().max().item() == 0
        else:  # they hold data only while their module runs
            assert model.mid.weight.numel() == 0
    finally:
        engine.close()


def test_accumulation_and_clipping_match_torch() -> None:
    model, ref = make_models(seed=3)
    data = batches(steps=3, micro=2, global_batch=8, seed=4)
    engine = st.initialize(model, config(2, "cpu", accumulation=2, clipping=0.05))
    try:
        train_engine(engine, data)
        train_reference(ref, data, clipping=0.05)
        for got, want in zip(engine.master_params(), [ref.emb.weight, ref.mid.weight, ref.mid.bias]):
            assert (got - want.detach()).abs().max().item() < ATOL
    finally:
        engine.close()


def test_stage_3_with_recompute_and_accumulation_matches_torch(io_dir) -> None:
    model, ref = make_models(seed=7, checkpointed=True)
    data = batches(steps=3, micro=2, global_batch=8, seed=8)
    engine = st.initialize(model, config(3, "nvme", accumulation=2, param="nvme", nvme_path=str(io_dir)))
    try:
        train_engine(engine, data)
        train_reference(ref, data)
        for got, want in zip(engine.master_params(), [ref.emb.weight, ref.mid.weight, ref.mid.bias]):
            assert (got - want.detach()).abs().max().item() < ATOL
    finally:
        engine.close()


def test_other_devices_are_refused_by_name() -> None:
    model, _ = make_models()
    cfg = config(1, "none")
    cfg["strata"] = {"device": "cuda"}
    with pytest.raises(NotImplementedError, match="sim device"):
        st.initialize(model, cfg)
    with pytest.raises(ValueError, match="unknown|did you mean"):
        st.initialize(model, {"zero_optimisation": {"stage": 1}})


def test_two_ranks_under_mpirun_match_torch_on_the_global_batch() -> None:
    script = Path(__file__).with_name("torch_engine_ranks.py")
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               PYTHONPATH=os.pathsep.join([str(Path(__file__).parent), *sys.path]))
    r = subprocess.run(["mpirun", "--oversubscribe", "--bind-to", "none", "-np", "2", sys.executable, str(script)],
                       env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "ranks match torch" in r.stdout
