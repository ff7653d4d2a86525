"""strata.torch.initialize against plain torch training (AdamW over the global batch)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import List

import pytest
import torch

import strata.torch as st
from torch_engine_model import batches, config, loss_of, make_external_models, make_models, train_reference

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


class LargeVocabModel(torch.nn.Module):
    """An embedding of 1024 x 16 tied to the head, beside eight small layers: the
    embedding is an outlier, and with 8 KiB chunks it takes a run of 8 of them."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(1024, 16)
        self.layers = torch.nn.ModuleList(torch.nn.Linear(16, 16) for _ in range(8))
        self.head = torch.nn.Linear(16, 1024, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.emb(x)
        for layer in self.layers:
            h = torch.tanh(layer(h))
        return self.head(h)


@pytest.mark.parametrize("stage,offload,param", [(1, "cpu", "none"), (3, "cpu", "cpu"), (3, "nvme", "nvme")])
def test_a_tensor_larger_than_a_chunk_matches_torch(stage: int, offload: str, param: str, io_dir) -> None:
    torch.manual_seed(3)
    model = LargeVocabModel()
    ref = LargeVocabModel()
    ref.load_state_dict(model.state_dict())
    g = torch.Generator().manual_seed(5)
    data = [[(torch.randint(0, 1024, (8, 5), generator=g), torch.randint(0, 1024, (8, 5), generator=g))]
            for _ in range(3)]
    lossf = lambda logits, y: torch.nn.functional.cross_entropy(logits.reshape(-1, 1024), y.reshape(-1))
    c = config(stage, offload, param=param, nvme_path=str(io_dir))
    c["strata"]["chunk_size"] = "8KiB"
    engine = st.initialize(model, c)
    try:
        assert engine._engine.run_chunks == 8, "the embedding's 16384 values over chunks of 2048"
        opt = torch.optim.AdamW(ref.parameters(), lr=0.01, weight_decay=0.01)
        for (x, y), in data:
            loss = lossf(engine(x), y)
            engine.backward(loss)
            engine.step()
            opt.zero_grad()
            want = lossf(ref(x), y)
            want.backward()
            opt.step()
            assert float(loss) == pytest.approx(float(want), rel=1e-5)
        masters = engine.master_params()
        assert len(masters) == 1 + 2 * 8, "the tied weight is one parameter"
        assert (masters[0] - ref.emb.weight.detach()).abs().max().item() < ATOL
        for got, want in zip(masters[1:], [p for layer in ref.layers for p in (layer.weight, layer.bias)]):
            assert (got - want.detach()).abs().max().item() < ATOL
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


@pytest.mark.parametrize("stage", [1, 3])
def test_torch_holds_no_more_than_one_parameter_gradient_in_backward(stage: int) -> None:
    """The engine takes each gradient as autograd produces it; torch's ``.grad`` copy of
    a parameter goes right after torch adds it, so the model's gradients are not held
    twice through the backward (with the tied weight: its two uses are one gradient)."""
    model, _ = make_models(seed=5)
    x, y = batches(steps=1, micro=1, global_batch=4, seed=6)[0][0]
    engine = st.initialize(model, config(stage, "cpu"))
    held = []  # at each parameter's gradient, how many parameters hold a .grad in torch
    params = [p for p in model.parameters() if p.requires_grad]
    for p in params:
        p.register_hook(lambda g: held.append(sum(q.grad is not None for q in params)))
    try:
        engine.backward(loss_of(engine(x), y))
        assert len(held) == len(params)
        assert max(held) == 0, held
        engine.step()
        assert all(p.grad is None for p in params)
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
    assert "external parameters match torch" in r.stdout
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



def state_files(path: Path) -> List[bytes]:
    """The checkpoint's state files (fp32 master, Adam m and v of every rank), as bytes."""
    files = sorted(path.glob("*.bin"))
    assert files, f"no state files in {path}"
    return [f.read_bytes() for f in files]


@pytest.mark.parametrize("stage,offload,param", [(1, "cpu", "none"), (3, "nvme", "nvme")])
def test_an_async_save_equals_the_synchronous_one_and_training_goes_on_bit_for_bit(
        stage: int, offload: str, param: str, io_dir) -> None:
    data = batches(steps=5, micro=1, global_batch=8, seed=13)
    cfg = config(stage, offload, param=param, nvme_path=str(io_dir))
    engine = st.initialize(make_models(seed=13)[0], cfg)
    try:  # no save at all
        plain = train_engine(engine, data)
        plain_masters = engine.master_params()
    finally:
        engine.close()
    engine = st.initialize(make_models(seed=13)[0], cfg)
    try:  # the synchronous save of step 2
        train_engine(engine, data[:2])
        engine.save_checkpoint(io_dir / "sync", client_state={"epoch": 1})
    finally:
        engine.close()
    engine = st.initialize(make_models(seed=13)[0], cfg)
    try:
        losses = train_engine(engine, data[:2])
        path = engine.save_checkpoint(io_dir / "async", client_state={"epoch": 1}, async_save=True)
        assert path == str(io_dir / "async" / "global_step2") and engine.checkpoint_pending == path
        # Written behind training: neither the directory nor latest is there before it finishes.
        assert not Path(path).exists() and not (io_dir / "async" / "latest").exists()
        losses += train_engine(engine, data[2:3])  # its step() finishes the save
        assert engine.checkpoint_pending is None
        assert (io_dir / "async" / "latest").read_text() == "global_step2"
        losses += train_engine(engine, data[3:])
        masters = engine.master_params()
    finally:
        engine.close()
    assert losses == plain
    for got, want in zip(masters, plain_masters):
        assert torch.equal(got, want)
    assert state_files(Path(path)) == state_files(io_dir / "sync" / "global_step2")
    engine = st.initialize(make_models(seed=14)[0], cfg)  # other initial values
    try:
        assert engine.load_checkpoint(io_dir / "async") == (path, {"epoch": 1})
        assert engine.global_steps == 2
        again = train_engine(engine, data[2:])
        resumed = engine.master_params()
    finally:
        engine.close()
    assert again == plain[2:]
    for got, want in zip(resumed, plain_masters):
        assert torch.equal(got, want)


def test_what_finishes_an_async_save(io_dir) -> None:
    data = batches(steps=2, micro=2, global_batch=8, seed=15)
    engine = st.initialize(make_models(seed=15)[0], config(2, "cpu", accumulation=2))
    try:
        train_engine(engine, data[:1])
        a = engine.save_checkpoint(io_dir / "c", tag="a", async_save=True)
        # Another save finishes the pending one first: at most one is in flight.
        b = engine.save_checkpoint(io_dir / "c", tag="b", async_save=True)
        assert Path(a).is_dir() and not Path(b).exists()
        assert (io_dir / "c" / "latest").read_text() == "a"
        assert engine.wait_checkpoint() == b and engine.wait_checkpoint() is None
        assert Path(b).is_dir() and (io_dir / "c" / "latest").read_text() == "b"
        # A step inside an accumulation window does not finish it; the one ending it does.
        d = engine.save_checkpoint(io_dir / "c", tag="d", async_save=True)
        x, y = data[1][0]
        engine.backward(loss_of(engine(x), y))
        assert engine.step() is None and engine.checkpoint_pending == d
        with pytest.raises(RuntimeError, match="inside an accumulation window"):
            engine.wait_checkpoint()
        engine.backward(loss_of(engine(x), y))
        report = engine.step()
        assert report["checkpoint"]["path"] == d and report["checkpoint"]["stalled_s"] >= 0
        assert Path(d).is_dir() and engine.checkpoint_pending is None
        # load_checkpoint finishes it, then loads what latest names: this very save.
        e = engine.save_checkpoint(io_dir / "c", tag="e", async_save=True)
        assert engine.load_checkpoint(io_dir / "c") == (e, {})
        f = engine.save_checkpoint(io_dir / "c", tag="f", async_save=True)
    finally:
        engine.close()  # finishes f
    assert Path(f).is_dir() and (io_dir / "c" / "latest").read_text() == "f"


def test_a_failed_save_names_its_directory_and_training_goes_on(io_dir) -> None:
    data = batches(steps=4, micro=1, global_batch=8, seed=16)
    cfg = config(2, "cpu")
    engine = st.initialize(make_models(seed=16)[0], cfg)
    try:
        plain = train_engine(engine, data)
    finally:
        engine.close()
    blocker = io_dir / "a-file"
    blocker.write_text("not a directory")
    engine = st.initialize(make_models(seed=16)[0], cfg)
    try:
        train_engine(engine, data[:1])
        for async_save in (False, True):  # refused as it starts
            with pytest.raises(NotADirectoryError) as refused:
                engine.save_checkpoint(blocker / "ckpt", async_save=async_save)
            assert refused.value.filename == str(blocker / "ckpt" / "global_step1")
            assert engine.checkpoint_pending is None
        engine.save_checkpoint(io_dir / "ckpt", tag="good")
        # A failure of the background writes is raised by the step() that finishes the save.
        path = engine.save_checkpoint(io_dir / "ckpt", async_save=True)
        (tmp,) = (io_dir / "ckpt").glob("global_step1.tmp-*")
        tmp.rename(io_dir / "gone")  # the disk loses the unfinished save
        with pytest.raises(OSError) as failed:
            train_engine(engine, data[1:2])
        assert failed.value.filename == path and path in str(failed.value)
        assert not Path(path).exists() and (io_dir / "ckpt" / "latest").read_text() == "good"
        assert engine.checkpoint_pending is None and engine.global_steps == 2  # the step was taken
        after = train_engine(engine, data[2:])
        assert engine.save_checkpoint(io_dir / "ckpt", async_save=True) == str(io_dir / "ckpt" / "global_step4")
        assert engine.wait_checkpoint() == str(io_dir / "ckpt" / "global_step4")
    finally:
        engine.close()
    assert after == plain[2:]


@pytest.mark.parametrize("stage,offload,param", [(3, "cpu", "cpu"), (3, "nvme", "nvme"), (2, "cpu", "none")])
def test_parameters_read_outside_their_module_match_torch(stage: int, offload: str, param: str, io_dir) -> None:
    model, ref = make_external_models(seed=17)
    st.register_external_parameter(model, model.wte.weight)
    data = batches(steps=12, micro=1, global_batch=8, seed=18)
    engine = st.initialize(model, config(stage, offload, param=param, nvme_path=str(io_dir)))
    try:
        losses = train_engine(engine, data)
        masters = engine.master_params()
        if stage == 3:  # released again once the forward and backward are done,
            assert model.wte.weight.numel() == 0 and model.pos_emb.numel() == 0
            with torch.no_grad():  # and after a forward without autograd too
                engine(data[0][0][0])
            assert model.wte.weight.numel() == 0 and model.mid.weight.numel() == 0
    finally:
        engine.close()
    ref_losses = train_reference(ref, data)
    assert losses == pytest.approx(ref_losses, rel=1e-5)
    assert len(masters) == len(list(ref.parameters()))
    for got, want in zip(masters, ref.parameters()):
        assert (got - want.detach()).abs().max().item() < ATOL


def test_a_released_parameter_read_in_the_forward_is_refused_by_name() -> None:
    model, _ = make_external_models(seed=19)  # the tied head not registered
    (x, y), = batches(steps=1, micro=1, global_batch=8)[0]
    engine = st.initialize(model, config(3, "cpu"))
    try:
        with pytest.raises(RuntimeError, match=r"'wte.weight' is read by linear in the forward of 'model'.*"
                                               r"register_external_parameter\(model, model.wte.weight\)"):
            engine(x)
    finally:
        engine.close()

    class Penalised(torch.nn.Module):
        """A forward that would compute with an empty tensor without a word: (w ** 2).sum() is 0."""

        def __init__(self) -> None:
            super().__init__()
            self.inner = torch.nn.Sequential(torch.nn.Embedding(32, 16), torch.nn.Linear(16, 32))

        def forward(self, t: torch.Tensor) -> torch.Tensor:
            return self.inner(t) + (self.inner[1].weight ** 2).sum()

    model = Penalised()
    engine = st.initialize(model, config(3, "cpu"))
    try:
        with pytest.raises(RuntimeError, match=r"'inner.1.weight' is read by .* in the forward of 'model' .*"
                                               r"held by inner.1"):
            engine(x)
        with pytest.raises(RuntimeError, match="before initialize"):
            st.register_external_parameter(model, model.inner[1].weight)
    finally:
        engine.close()
    other = torch.nn.Linear(2, 2)
    fresh = Penalised()
    st.register_external_parameter(fresh, other.weight)
    with pytest.raises(ValueError, match="not a parameter of the model"):
        st.initialize(fresh, config(3, "cpu"))


@pytest.mark.parametrize("stage,offload,param,accumulation",
                         [(1, "cpu", "none", 1), (3, "cpu", "cpu", 2), (3, "nvme", "nvme", 1)])
def test_evaluation_under_no_grad_trains_nothing(stage: int, offload: str, param: str, accumulation: int,
                                                 io_dir) -> None:
    """A forward under torch.no_grad() between steps is an evaluation pass: the training is
    the same to the bit, and its loss is that of the parameters the last step left (a
    plain model with the masters). Inside an accumulation window it is refused by name,
    and training goes on as if it had not been tried."""
    data = batches(3, accumulation, 8)

    def run(evaluate: bool):
        engine = st.initialize(make_models(seed=3)[0], config(stage, offload, accumulation=accumulation,
                                                               param=param))
        losses, evals = [], []
        try:
            for micro_batches in data:
                for i, (x, y) in enumerate(micro_batches):
                    loss = loss_of(engine(x), y)
                    engine.backward(loss)
                    losses.append(float(loss))
                    if evaluate and i + 1 < len(micro_batches):
                        with torch.no_grad(), pytest.raises(RuntimeError, match="evaluate after step"):
                            engine(x)  # inside the window, between its micro-batches
                engine.step()
                if evaluate:
                    with torch.no_grad():
                        x, y = micro_batches[0]
                        evals.append((float(loss_of(engine(x), y)), engine.master_params()))
            return losses, engine.master_params(), evals
        finally:
            engine.close()

    plain_losses, plain_masters, _ = run(False)
    losses, masters, evals = run(True)
    assert losses == plain_losses
    for got, want in zip(masters, plain_masters):
        assert torch.equal(got, want)
    assert len(evals) == len(data)
    for (value, step_masters), micro_batches in zip(evals, data):
        ref = make_models(seed=3)[1]
        with torch.no_grad():
            params = list(ref.parameters())  # named_parameters order, the tied weight once: the engine's
            assert len(params) == len(step_masters)
            for p, m in zip(params, step_masters):
                p.copy_(m)
            x, y = micro_batches[0]
            assert value == pytest.approx(float(loss_of(ref(x), y)), rel=1e-6)


@pytest.mark.parametrize("stage,offload,param", [(2, "cpu", "none"), (3, "cpu", "cpu"), (3, "nvme", "nvme")])
@pytest.mark.parametrize("frozen", [("mid",), ("out",), ("emb",)])
def test_frozen_parameters_stay_as_they_were_and_the_rest_match_torch(stage: int, offload: str, param: str,
                                                                      frozen, io_dir) -> None:
    """requires_grad False at initialize: the parameter is neither stepped nor decayed (as
    torch's AdamW leaves it), and the trainable ones match plain torch training."""
    model, ref = make_models(seed=5)
    for m in (model, ref):
        for name in frozen:
            getattr(m, name).requires_grad_(False)
    before = {n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad}
    data = batches(4, 1, 8)
    engine = st.initialize(model, config(stage, offload, param=param))
    try:
        losses = train_engine(engine, data)
        masters = engine.master_params()
    finally:
        engine.close()
    want_losses = train_reference(ref, data)
    assert losses == pytest.approx(want_losses, rel=1e-5)
    trainable = [p for p in ref.parameters() if p.requires_grad]
    assert len(masters) == len(trainable)
    for got, want in zip(masters, trainable):
        assert (got - want.detach()).abs().max().item() < ATOL
    for n, p in model.named_parameters():
        if n in before:
            assert torch.equal(p.detach(), before[n]), f"{n} is frozen and must not change"
