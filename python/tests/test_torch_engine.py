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


def test_two_ranks_under_mpirun_match_torch_and_their_checkpoint_loads_on_one(io_dir) -> None:
    script = Path(__file__).with_name("torch_engine_ranks.py")
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               PYTHONPATH=os.pathsep.join([str(Path(__file__).parent), *sys.path]))
    ckpt = io_dir / "two-ranks"
    r = subprocess.run(["mpirun", "--oversubscribe", "--bind-to", "none", "-np", "2", sys.executable, str(script),
                        str(ckpt)], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "ranks match torch" in r.stdout
    # Saved by two ranks at stage 3; loaded by this one at stage 1 (resharded).
    model, _ = make_models(seed=11)
    engine = st.initialize(model, config(1, "cpu", accumulation=2))
    try:
        path, client = engine.load_checkpoint(ckpt)
        assert path == str(ckpt / "global_step3") and client == {"ranks": 2}
        want = torch.load(ckpt / "masters.pt")
        for got, w in zip(engine.master_params(), want):
            assert torch.equal(got, w)
    finally:
        engine.close()


@pytest.mark.parametrize("stage,offload,param", [(1, "cpu", "none"), (3, "nvme", "nvme")])
def test_a_checkpoint_resumes_bit_for_bit(stage: int, offload: str, param: str, io_dir) -> None:
    data = batches(steps=4, micro=1, global_batch=8, seed=9)
    cfg = config(stage, offload, param=param, nvme_path=str(io_dir))
    engine = st.initialize(make_models(seed=9)[0], cfg)
    try:
        train_engine(engine, data[:2])
        path = engine.save_checkpoint(io_dir / "ckpt", client_state={"epoch": 1})
        after = train_engine(engine, data[2:])
        want = engine.master_params()
    finally:
        engine.close()
    assert path == str(io_dir / "ckpt" / "global_step2")
    assert (io_dir / "ckpt" / "latest").read_text() == "global_step2"
    engine = st.initialize(make_models(seed=10)[0], cfg)  # other initial values
    try:
        loaded, client = engine.load_checkpoint(io_dir / "ckpt")
        assert (loaded, client, engine.global_steps) == (path, {"epoch": 1}, 2)
        again = train_engine(engine, data[2:])
        got = engine.master_params()
    finally:
        engine.close()
    assert again == after
    for g, w in zip(got, want):
        assert torch.equal(g, w)


def test_checkpoint_misuse_is_refused_by_name(io_dir) -> None:
    engine = st.initialize(make_models(seed=12)[0], config(2, "cpu", accumulation=2))
    try:
        assert engine.load_checkpoint(io_dir / "nothing-here") == (None, None)
        x, y = batches(steps=1, micro=1, global_batch=8)[0][0]
        engine.backward(loss_of(engine(x), y))
        with pytest.raises(RuntimeError, match="inside an accumulation window"):
            engine.save_checkpoint(io_dir / "ckpt")
        engine.backward(loss_of(engine(x), y))
        engine.step()
        with pytest.raises(TypeError, match="client_state must be JSON"):
            engine.save_checkpoint(io_dir / "ckpt", client_state={"bad": object()})
        engine.save_checkpoint(io_dir / "ckpt", tag="mine")
        engine.lr = 0.5
        assert engine.lr == 0.5
        with pytest.raises(ValueError, match="learning rate"):
            engine.lr = -1.0
    finally:
        engine.close()
    other = torch.nn.Sequential(torch.nn.Linear(4, 4))
    engine = st.initialize(other, config(1, "cpu"))
    try:
        with pytest.raises(ValueError, match="does not fit this engine"):
            engine.load_checkpoint(io_dir / "ckpt", tag="mine")
    finally:
        engine.close()
