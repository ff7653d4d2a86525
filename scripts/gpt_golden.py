#!/usr/bin/env python3
"""Writes golden data of a tiny GPT-2 style model for strata's CPU kernel tests.

As llm.c does: PyTorch (Debian's python3-torch, CPU, fp32) runs one forward and backward
of a tiny decoder-only transformer, and this script stores its weights, one batch, the
logits, the loss and every parameter gradient. tests/model/gpt_kernels_test.cc rebuilds
the model from strata's kernels and compares.

Usage: scripts/gpt_golden.py [--bf16] [OUT]   (default tests/data/gpt_golden.bin, or
tests/data/gpt_golden_bf16.bin with --bf16; run with python/.venv/bin/python or any
python3 that has torch). Deterministic: fixed seeds, one thread.

--bf16: the same model with every parameter rounded to bf16 first (round to nearest even)
and then run in fp32: what strata's GPT computes with bf16 parameters (16-bit weights,
fp32 activations and sums; include/strata/gpt.h). The file stores the rounded values.
This is not torch autocast, which would also round activations.

The model: token + learned position embeddings; n_layer pre-LayerNorm blocks
x = x + proj(attn(ln1(x))), x = x + fcproj(gelu_tanh(fc(ln2(x)))); a final LayerNorm;
the LM head tied to the token embedding (logits = lnf(x) wte^T); mean cross-entropy over
the B * T tokens. Attention: qkv = Linear(C, 3C) split into q | k | v, heads of C / NH
columns each, causal softmax(q k^T / sqrt(hs)) v.

File format (little-endian):
  header: 16 int32: [0] magic 0x54504753 ("SGPT"), [1] version 1, [2] vocab V,
          [3] block_size, [4] n_layer L, [5] n_head, [6] n_embd C, [7] batch B,
          [8] seq T, [9] number of parameter floats P, [10..15] 0
  tokens  int32 [B, T]
  targets int32 [B, T]
  loss    float32 [1]
  logits  float32 [B, T, V]
  params  float32 [P]: the tensors below, in this order, each row-major
  grads   float32 [P]: their gradients, in the same order
Tensor order (Linear weights are [out, in] as in torch):
  wte [V, C], wpe [block_size, C],
  per layer l = 0..L-1: ln1.weight [C], ln1.bias [C], attn.qkv.weight [3C, C],
    attn.qkv.bias [3C], attn.proj.weight [C, C], attn.proj.bias [C], ln2.weight [C],
    ln2.bias [C], mlp.fc.weight [4C, C], mlp.fc.bias [4C], mlp.proj.weight [C, 4C],
    mlp.proj.bias [C],
  lnf.weight [C], lnf.bias [C].
"""

import math
import struct
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

VOCAB, BLOCK, N_LAYER, N_HEAD, N_EMBD = 64, 16, 2, 2, 32
BATCH, SEQ = 2, 16
MAGIC, VERSION = 0x54504753, 1


class Block(torch.nn.Module):
    def __init__(self, c, n_head):
        super().__init__()
        self.n_head = n_head
        self.ln1 = torch.nn.LayerNorm(c)
        self.qkv = torch.nn.Linear(c, 3 * c)
        self.proj = torch.nn.Linear(c, c)
        self.ln2 = torch.nn.LayerNorm(c)
        self.fc = torch.nn.Linear(c, 4 * c)
        self.fc_proj = torch.nn.Linear(4 * c, c)

    def attn(self, x):
        b, t, c = x.shape
        hs = c // self.n_head
        q, k, v = self.qkv(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.n_head, hs).transpose(1, 2) for z in (q, k, v))
        scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))
        mask = torch.tril(torch.ones(t, t, dtype=torch.bool))
        att = F.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)
        return self.proj((att @ v).transpose(1, 2).contiguous().view(b, t, c))

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.fc_proj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class Gpt(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.wte = torch.nn.Parameter(torch.empty(VOCAB, N_EMBD))
        self.wpe = torch.nn.Parameter(torch.empty(BLOCK, N_EMBD))
        self.blocks = torch.nn.ModuleList(Block(N_EMBD, N_HEAD) for _ in range(N_LAYER))
        self.lnf = torch.nn.LayerNorm(N_EMBD)

    def ordered_params(self):
        out = [self.wte, self.wpe]
        for blk in self.blocks:
            for m in (blk.ln1, blk.qkv, blk.proj, blk.ln2, blk.fc, blk.fc_proj):
                out += [m.weight, m.bias]
        return out + [self.lnf.weight, self.lnf.bias]

    def forward(self, tokens, targets):
        x = self.wte[tokens] + self.wpe[: tokens.shape[1]]
        for blk in self.blocks:
            x = blk(x)
        logits = self.lnf(x) @ self.wte.t()
        return logits, F.cross_entropy(logits.view(-1, VOCAB), targets.view(-1))


def init_(model, gen):
    # Larger than GPT-2's 0.02 and no zero biases or unit LayerNorm weights, so every
    # parameter changes the output, attention is far from uniform and GELU far from linear:
    # a kernel that drops a term cannot pass by accident.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name in ("wte", "wpe"):
                p.copy_(torch.randn(p.shape, generator=gen) * 0.3)
            elif name.startswith("lnf") or ".ln" in name:
                base = 1.0 if name.endswith("weight") else 0.0
                p.copy_(base + torch.randn(p.shape, generator=gen) * 0.1)
            elif name.endswith("weight"):
                p.copy_(torch.randn(p.shape, generator=gen) / math.sqrt(p.shape[1]))
            else:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.1)


def main():
    args = [a for a in sys.argv[1:] if a != "--bf16"]
    bf16 = len(args) < len(sys.argv) - 1
    default = "tests/data/gpt_golden_bf16.bin" if bf16 else "tests/data/gpt_golden.bin"
    out = Path(args[0]) if args else Path(__file__).parent.parent / default
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(20240521)
    model = Gpt()
    init_(model, gen)
    if bf16:
        with torch.no_grad():
            for p in model.parameters():
                p.copy_(p.to(torch.bfloat16).to(torch.float32))
    seq = torch.randint(0, VOCAB, (BATCH, SEQ + 1), generator=gen)
    tokens, targets = seq[:, :SEQ].contiguous(), seq[:, 1:].contiguous()
    logits, loss = model(tokens, targets)
    loss.backward()

    params = model.ordered_params()
    assert len(params) == len(list(model.parameters()))
    n_params = sum(p.numel() for p in params)
    header = [MAGIC, VERSION, VOCAB, BLOCK, N_LAYER, N_HEAD, N_EMBD, BATCH, SEQ, n_params] + [0] * 6

    def f32(t):
        return t.detach().to(torch.float32).contiguous().numpy().astype("<f4").tobytes()

    def i32(t):
        return t.to(torch.int32).contiguous().numpy().astype("<i4").tobytes()

    with open(out, "wb") as f:
        f.write(struct.pack("<16i", *header))
        f.write(i32(tokens) + i32(targets))
        f.write(struct.pack("<f", loss.item()))
        f.write(f32(logits))
        for p in params:
            f.write(f32(p))
        for p in params:
            f.write(f32(p.grad))
    print(f"{out}: loss {loss.item():.6f}, {n_params} parameters, {out.stat().st_size} bytes")


if __name__ == "__main__":
    main()
