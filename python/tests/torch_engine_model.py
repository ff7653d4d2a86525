"""A small model with a tied embedding and LM head, and its plain torch training: shared
by test_torch_engine.py and the script it runs under mpirun."""

from __future__ import annotations

import copy
from typing import Dict, List, Tuple

import torch
import torch.utils.checkpoint

VOCAB, WIDTH, SEQ = 32, 16, 5


class TiedModel(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(VOCAB, WIDTH)
        self.mid = torch.nn.Linear(WIDTH, WIDTH)
        self.out = torch.nn.Linear(WIDTH, WIDTH)
        self.head = torch.nn.Linear(WIDTH, VOCAB, bias=False)
        self.head.weight = self.emb.weight  # one parameter, used by two modules

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.out(torch.tanh(self.mid(self.emb(x)))))


class CheckpointedModel(TiedModel):
    """TiedModel with its middle block recomputed in backward (torch.utils.checkpoint)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.utils.checkpoint.checkpoint(lambda t: torch.tanh(self.mid(t)), self.emb(x), use_reentrant=False)
        return self.head(self.out(h))


class ExternalModel(torch.nn.Module):
    """Parameters read outside their module's forward: a position embedding held by the
    root itself, and an LM head tied to the token embedding written as a function of
    its weight in the root's forward (GPT-2's style), not as a module."""

    def __init__(self) -> None:
        super().__init__()
        self.wte = torch.nn.Embedding(VOCAB, WIDTH)
        self.pos_emb = torch.nn.Parameter(torch.randn(SEQ, WIDTH) * 0.1)
        self.mid = torch.nn.Linear(WIDTH, WIDTH)
        self.out = torch.nn.Linear(WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.mid(self.wte(x) + self.pos_emb))
        return torch.nn.functional.linear(self.out(h), self.wte.weight)


def make_external_models(seed: int = 0) -> Tuple[ExternalModel, ExternalModel]:
    """ExternalModel and a plain copy of it, in named_parameters order (the engine's)."""
    torch.manual_seed(seed)
    m = ExternalModel()
    ref = copy.deepcopy(m)
    return m, ref


def make_models(seed: int = 0, checkpointed: bool = False) -> Tuple[TiedModel, TiedModel]:
    """The model to train and a plain copy of it (the reference computes without recompute)."""
    torch.manual_seed(seed)
    m = CheckpointedModel() if checkpointed else TiedModel()
    ref = TiedModel()
    ref.load_state_dict(m.state_dict())
    return m, ref


def batches(steps: int, micro: int, global_batch: int, seed: int = 1) -> List[List[Tuple[torch.Tensor, torch.Tensor]]]:
    """steps x micro-batches of the global batch (every rank's samples), tokens and targets."""
    g = torch.Generator().manual_seed(seed)
    return [[(torch.randint(0, VOCAB, (global_batch, SEQ), generator=g),
              torch.randint(0, VOCAB, (global_batch, SEQ), generator=g)) for _ in range(micro)]
            for _ in range(steps)]


def loss_of(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), y.reshape(-1))


def config(stage: int, offload: str, accumulation: int = 1, clipping: float = 0.0, param: str = "none",
           nvme_path: str = "") -> Dict:
    c = {"zero_optimization": {"stage": stage},
         "optimizer": {"type": "AdamW", "params": {"lr": 0.01, "weight_decay": 0.01}},
         "gradient_accumulation_steps": accumulation,
         "strata": {"chunk_size": "4KiB"}}  # several chunks even for this small model
    if offload != "none":
        c["zero_optimization"]["offload_optimizer"] = {"device": offload, "nvme_path": nvme_path}
    if param != "none":
        c["zero_optimization"]["offload_param"] = {"device": param, "nvme_path": nvme_path}
    if clipping:
        c["gradient_clipping"] = clipping
    return c


def train_reference(model: TiedModel, data, clipping: float = 0.0) -> List[float]:
    """torch.optim.AdamW over the global batch; DeepSpeed's clipping rule is torch's
    clip_grad_norm_ (max_norm / (norm + 1e-6) when that is below 1)."""
    opt = torch.optim.AdamW(model.parameters(), lr=0.01, weight_decay=0.01)
    losses = []
    for micro_batches in data:
        opt.zero_grad()
        total = 0.0
        for x, y in micro_batches:
            loss = loss_of(model(x), y)
            (loss / len(micro_batches)).backward()
            total += float(loss) / len(micro_batches)
        if clipping:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clipping)
        opt.step()
        losses.append(total)
    return losses
