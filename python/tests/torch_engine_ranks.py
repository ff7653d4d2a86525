"""Run by test_torch_engine.py under mpirun -np 2 (stage 3, optimizer state and parameters
in pinned host memory): each rank trains its half of every global batch; rank 0 compares
the engine's masters with torch on the whole batch. Then the ranks save a checkpoint into
argv[1], and rank 0 writes the masters beside it (masters.pt) for the test to compare.
Last, the same for a model whose forward reads parameters outside their modules
(ExternalModel), over 10 steps."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

import strata.torch as st
from torch_engine_model import batches, config, make_external_models, make_models, train_reference
from test_torch_engine import ATOL, train_engine

model, ref = make_models(seed=5)
data = batches(steps=3, micro=2, global_batch=8, seed=6)
engine = st.initialize(model, config(3, "cpu", accumulation=2, param="cpu"))
train_engine(engine, data, rank=engine.rank, world=engine.world_size)
masters = engine.master_params()  # collective
if engine.rank == 0:
    train_reference(ref, data)
    want = [ref.emb.weight, ref.mid.weight, ref.mid.bias, ref.out.weight, ref.out.bias]
    worst = max((g - w.detach()).abs().max().item() for g, w in zip(masters, want))
    print(f"world {engine.world_size}: largest difference {worst:.3g}")
    if worst >= ATOL:
        sys.exit(1)
    print("ranks match torch")
ckpt = Path(sys.argv[1])
engine.save_checkpoint(ckpt, client_state={"ranks": engine.world_size})
if engine.rank == 0:
    torch.save(masters, ckpt / "masters.pt")
engine.close()

model, ref = make_external_models(seed=7)
st.register_external_parameter(model, model.wte.weight)
data = batches(steps=10, micro=1, global_batch=8, seed=8)
engine = st.initialize(model, config(3, "cpu", param="cpu"))
train_engine(engine, data, rank=engine.rank, world=engine.world_size)
masters = engine.master_params()
if engine.rank == 0:
    train_reference(ref, data)
    worst = max((g - w.detach()).abs().max().item() for g, w in zip(masters, ref.parameters()))
    print(f"world {engine.world_size}, external parameters: largest difference {worst:.3g}")
    if worst >= ATOL:
        sys.exit(1)
    print("external parameters match torch")
engine.close()
