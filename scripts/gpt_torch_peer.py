#!/usr/bin/python3
"""The PyTorch peer of `strata train --model gpt`: the same GPT, the same initial weights,
the same batches and the same optimizer, in eager PyTorch (fp32, CPU), for checking
strata's losses and for comparing its speed with PyTorch's.

Usage (python/.venv/bin/python, or any python3 with Debian's python3-torch and numpy):
  scripts/gpt_torch_peer.py --train --data DIR --n-layer 2 --n-head 2 --n-embd 64 --seq 64 \\
      --micro-batch 4 --steps 20 --lr 1e-3 --seed 1 --eval-every 5 --eval-batches 2 --log peer.jsonl
  scripts/gpt_torch_peer.py --bench --data DIR ... --warmup 2 --bench-steps 10 [--json]
DIR holds train.tokens and val.tokens (`strata data prepare --out DIR`).

What is replicated, and from where (keep in step with the C++):
  Model     scripts/gpt_golden.py's Block (pre-LayerNorm, causal attention through a qkv
            Linear, tanh GELU MLP of 4C, LayerNorm eps 1e-5), token + learned position
            embeddings, final LayerNorm, logits = lnf(x) wte^T (tied; --untied: a
            separate lm_head.weight [V, C]), mean cross-entropy over the batch's tokens
            (include/strata/gpt.h). vocab_size: the token file's unless --vocab;
            block_size: --block-size, default --seq.
  Init      model::InitGptTensor (src/model/gpt.cc): tensor id t in GptModel's order; for
            N(0, s) tensors element i is Box-Muller over HashUniform(seed, t + 1, 2i) and
            HashUniform(seed, t + 1, 2i + 1) (src/model/model.cc), s = 0.02, or
            0.02 / sqrt(2 n_layer) for attn.proj.weight and mlp.proj.weight; linear biases
            and LayerNorm biases 0, LayerNorm weights 1. Computed here with 64-bit integer
            arithmetic (numpy uint64, wrapping mod 2^64) and double as in the C++.
  Data      model::SampleStart / FillBatch (src/model/token_data.cc): micro-batch m of
            step s (0-based; the log's step s + 1) holds global samples
            s * G + m * B + j, j in [0, B), G = B * accumulation (one rank; with N ranks
            strata's global batch is the same samples as micro-batch N * B here). Sample k
            starts at p = SampleStart(data_seed, k, size, T): tokens = file[p, p + T),
            targets = file[p + 1, p + T + 1). Seeds (src/cli/train.cc): --seed is strata
            config's "seed" (default 1234), the init seed; data_seed = seed + 1.
  Validation  (zero/gpt_trainer.h) the same fixed samples at every evaluation: sample j
            of val.tokens under seed data_seed + 7, j in [0, eval_batches * B), in
            micro-batches of B; the loss is the mean token loss over all of them.
            Evaluations: before the first step (logged as step 0), after every
            eval_every-th step, and after the last step (src/cli/gpt_train_job.cc).
  Optimizer strata's Adam (include/strata/adam.h) = torch.optim.AdamW (default; decoupled
            decay p *= 1 - lr wd) or torch.optim.Adam (--adam: L2 decay added to the
            gradient), bias-corrected, eps added after sqrt(v) / sqrt(1 - beta2^t); one
            group, every parameter decayed (the tied wte is one parameter). Defaults as
            strata's config (include/strata/config.h): betas 0.9, 0.999, eps 1e-8,
            weight decay 0.01. The learning rate: --lr, or per step the schedule of
            --config's DeepSpeed "scheduler" block (scripts/ds_lr_schedule.py, as
            include/strata/lr_schedule.h; every fp32 step is applied).
  Clipping  --clip C > 0: torch.nn.utils.clip_grad_norm_ (coefficient C / (norm + 1e-6),
            applied when below 1), as src/zero/engine_update.cc.
  Loss      the logged loss of step s is the mean token loss of its batch before that
            step's update, as strata's.

Log (--log FILE, JSON lines, the format of `strata train --model gpt --log`):
  {"step": i, "loss": x, "lr": x, "tokens_per_s": x, "seconds": x, "grad_norm": x}  per step
  (i from 1; seconds: batch, forward, backward and optimizer step), and
  {"step": i, "val_loss": x} per evaluation.
--bench prints tokens/s over --bench-steps steps after --warmup steps (no evaluation).

Threads: --threads N is torch.set_num_threads(N) (ATen's OpenMP pool). Debian's torch does
its fp32 matrix products in the libblas.so.3 alternative (OpenBLAS, pthread build), whose
own pool has OPENBLAS_NUM_THREADS threads (default: every core). Two pools of all cores
oversubscribe: on 2 cores --threads 2 ran 1.6-2.4x slower than --threads 1 (OpenBLAS
still on both cores), the fastest PyTorch setting measured there (docs/benchmarks.md).
scripts/gpt_compare.py runs this peer beside `strata train --model gpt`.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
import ds_lr_schedule  # noqa: E402  (beside this script)
from gpt_golden import Block  # noqa: E402  (the model the kernel tests are checked against)
from strata_replica import (  # noqa: E402,F401  (the tests reach them through this module)
    TokenFile, hash_uniform, init_tensor, mix64, sample_start, sample_starts, tensor_specs)


def torch_batch(f: TokenFile, seed: int, first: int, count: int, seq: int):
    tokens, targets = f.batch(seed, first, count, seq)
    return torch.from_numpy(tokens), torch.from_numpy(targets)

VALIDATION_SEED_OFFSET = 7  # zero/gpt_trainer.h's kValidationSeedOffset


class GptPeer(torch.nn.Module):
    """strata's GPT (include/strata/gpt.h) from gpt_golden.py's Block."""

    def __init__(self, vocab: int, block: int, n_layer: int, n_head: int, n_embd: int, tied: bool = True):
        super().__init__()
        if n_embd % n_head:
            raise ValueError(f"n_embd ({n_embd}) must be a multiple of n_head ({n_head})")
        self.vocab, self.block, self.n_layer, self.tied = vocab, block, n_layer, tied
        self.wte = torch.nn.Parameter(torch.empty(vocab, n_embd))
        self.wpe = torch.nn.Parameter(torch.empty(block, n_embd))
        self.blocks = torch.nn.ModuleList(Block(n_embd, n_head) for _ in range(n_layer))
        self.lnf = torch.nn.LayerNorm(n_embd)
        self.lm_head = None if tied else torch.nn.Parameter(torch.empty(vocab, n_embd))

    def ordered_params(self):
        """The parameters in GptModel's tensor-id order."""
        out = [self.wte, self.wpe]
        for blk in self.blocks:
            for m in (blk.ln1, blk.qkv, blk.proj, blk.ln2, blk.fc, blk.fc_proj):
                out += [m.weight, m.bias]
        out += [self.lnf.weight, self.lnf.bias]
        return out if self.tied else out + [self.lm_head]

    def init_like_strata(self, seed: int) -> None:
        specs = tensor_specs(self.vocab, self.block, self.n_layer, self.wte.shape[1], self.tied)
        with torch.no_grad():
            for tid, (p, (name, shape, kind)) in enumerate(zip(self.ordered_params(), specs)):
                assert tuple(p.shape) == tuple(shape), (name, p.shape, shape)
                p.copy_(torch.from_numpy(init_tensor(seed, tid, kind, shape, self.n_layer)))

    def forward(self, tokens, targets):
        x = self.wte[tokens] + self.wpe[: tokens.shape[1]]
        for blk in self.blocks:
            x = blk(x)
        head = self.wte if self.tied else self.lm_head
        logits = self.lnf(x) @ head.t()
        return F.cross_entropy(logits.view(-1, self.vocab), targets.reshape(-1))


# ---- training ----------------------------------------------------------------------------


class Peer:
    def __init__(self, args):
        self.args = args
        data = Path(args.data)
        self.train = TokenFile(data / "train.tokens")
        self.val = TokenFile(data / "val.tokens") if (data / "val.tokens").exists() else None
        vocab = args.vocab or self.train.vocab
        block = args.block_size or args.seq
        if args.seq > block:
            raise SystemExit(f"--seq {args.seq} exceeds --block-size {block}")
        for f in (self.train, self.val):
            if f is not None and f.size <= args.seq + 1:
                raise SystemExit(f"{f.path}: {f.size} tokens, too few for samples of {args.seq} tokens")
        self.model = GptPeer(vocab, block, args.n_layer, args.n_head, args.n_embd, tied=not args.untied)
        self.model.init_like_strata(args.seed)
        opt = torch.optim.Adam if args.adam else torch.optim.AdamW
        self.opt = opt(
            self.model.parameters(),
            lr=args.lr,
            betas=(args.beta1, args.beta2),
            eps=args.eps,
            weight_decay=args.weight_decay,
        )
        self.data_seed = args.seed + 1 if args.data_seed is None else args.data_seed
        self.accum = args.gradient_accumulation_steps
        self.schedule = None
        if args.config:
            self.schedule = json.loads(Path(args.config).read_text()).get("scheduler")
            try:
                ds_lr_schedule.check(self.schedule)
            except ValueError as e:
                raise SystemExit(f"--config {args.config}: {e}") from None

    def lr(self, step: int) -> float:
        """The rate of training step `step` (0-based): every step is applied (fp32)."""
        return ds_lr_schedule.rate_at(self.schedule, step, self.args.lr)

    def step(self, step: int):
        """Training step `step` (0-based): (loss before the update, grad norm)."""
        b, t, accum = self.args.micro_batch, self.args.seq, self.accum
        for group in self.opt.param_groups:
            group["lr"] = self.lr(step)
        self.opt.zero_grad(set_to_none=False)
        loss_sum = 0.0
        for m in range(accum):
            tokens, targets = torch_batch(self.train, self.data_seed, step * b * accum + m * b, b, t)
            loss = self.model(tokens, targets) / accum
            loss.backward()
            loss_sum += loss.item()
        params = [p for p in self.model.parameters()]
        if self.args.clip > 0:
            norm = float(torch.nn.utils.clip_grad_norm_(params, self.args.clip))
        else:
            norm = float(torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in params])))
        self.opt.step()
        return loss_sum, norm

    @torch.no_grad()
    def evaluate(self) -> float:
        b, t, n = self.args.micro_batch, self.args.seq, self.args.eval_batches
        seed = self.data_seed + VALIDATION_SEED_OFFSET
        total = 0.0
        for i in range(n):
            tokens, targets = torch_batch(self.val, seed, i * b, b, t)
            total += self.model(tokens, targets).item() / n
        return total


def run_train(peer: Peer, args) -> None:
    log = open(args.log, "w") if args.log else None

    def write(line):
        if log:
            log.write(json.dumps(line) + "\n")
            log.flush()

    def evaluate(step):
        if peer.val is None:
            return
        v = peer.evaluate()
        write({"step": step, "val_loss": v})
        print(f"validation loss {v:.6f} after {step} steps", flush=True)

    tokens_per_step = args.micro_batch * args.seq * peer.accum
    evaluate(0)
    for s in range(args.steps):
        t0 = time.perf_counter()
        loss, norm = peer.step(s)
        sec = time.perf_counter() - t0
        write({"step": s + 1, "loss": loss, "lr": peer.lr(s), "tokens_per_s": tokens_per_step / sec,
               "seconds": sec, "grad_norm": norm})
        print(f"step {s + 1:5d}/{args.steps}  loss {loss:.6f}  {tokens_per_step / sec:.0f} tokens/s", flush=True)
        last = s + 1 == args.steps
        if last or (args.eval_every > 0 and (s + 1) % args.eval_every == 0):
            evaluate(s + 1)
    if log:
        log.close()


def run_bench(peer: Peer, args) -> None:
    for s in range(args.warmup):
        peer.step(s)
    t0 = time.perf_counter()
    for s in range(args.warmup, args.warmup + args.bench_steps):
        peer.step(s)
    sec = time.perf_counter() - t0
    tokens = args.micro_batch * args.seq * peer.accum * args.bench_steps
    n_params = sum(p.numel() for p in peer.model.parameters())
    result = {
        "framework": f"pytorch {torch.__version__}",
        "threads": torch.get_num_threads(),
        "params": n_params,
        "n_layer": args.n_layer,
        "n_head": args.n_head,
        "n_embd": args.n_embd,
        "seq": args.seq,
        "micro_batch": args.micro_batch,
        "steps": args.bench_steps,
        "seconds": sec,
        "tokens_per_s": tokens / sec,
    }
    if args.json:
        print(json.dumps(result))
    else:
        print(f"pytorch {torch.__version__}, {torch.get_num_threads()} threads, {n_params} parameters: "
              f"{tokens / sec:.1f} tokens/s ({sec / args.bench_steps * 1e3:.1f} ms/step)")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    mode = p.add_mutually_exclusive_group(required=True)
    mode.add_argument("--train", action="store_true", help="train --steps steps, evaluating, logging")
    mode.add_argument("--bench", action="store_true", help="time --bench-steps steps after --warmup")
    p.add_argument("--data", required=True, help="folder with train.tokens and val.tokens")
    p.add_argument("--n-layer", type=int, default=4)
    p.add_argument("--n-head", type=int, default=4)
    p.add_argument("--n-embd", type=int, default=128)
    p.add_argument("--seq", type=int, default=128, help="tokens per sample")
    p.add_argument("--block-size", type=int, default=0, help="rows of wpe (default --seq)")
    p.add_argument("--vocab", type=int, default=0, help="vocab_size (default: the token file's)")
    p.add_argument("--untied", action="store_true", help="an lm_head.weight of its own")
    p.add_argument("--micro-batch", type=int, default=8)
    p.add_argument("--gradient-accumulation-steps", type=int, default=1)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--lr", type=float, default=1e-3, help="the base rate (a schedule's peak)")
    p.add_argument("--config", default="", help="a DeepSpeed config: its scheduler block sets the rate per step")
    p.add_argument("--beta1", type=float, default=0.9)
    p.add_argument("--beta2", type=float, default=0.999)
    p.add_argument("--eps", type=float, default=1e-8)
    p.add_argument("--weight-decay", type=float, default=0.01)
    p.add_argument("--adam", action="store_true", help="Adam with L2 decay instead of AdamW")
    p.add_argument("--clip", type=float, default=0.0, help="gradient clipping max norm (0: off)")
    p.add_argument("--seed", type=int, default=1234, help="strata config's seed: the parameter init seed")
    p.add_argument("--data-seed", type=int, default=None, help="batch seed (default --seed + 1, as strata)")
    p.add_argument("--eval-every", type=int, default=50, help="0: only before the first and after the last step")
    p.add_argument("--eval-batches", type=int, default=4)
    p.add_argument("--log", default="", help="JSON-lines log")
    p.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0: torch's default)")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--bench-steps", type=int, default=10)
    p.add_argument("--json", action="store_true", help="--bench: print the result as JSON")
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)  # nothing random is drawn; for certainty
    peer = Peer(args)
    if args.train:
        run_train(peer, args)
    else:
        run_bench(peer, args)


if __name__ == "__main__":
    main()
