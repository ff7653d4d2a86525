#!/usr/bin/env python3
"""The peer of bench/bpe_bench.cc: Hugging Face tokenizers' ByteLevelBPETokenizer on the
same corpus (the default one, concatenated in name order) with the same vocabulary
(tests/data/bpe), one thread, best of N runs; cold (a fresh tokenizer each run) and warm.

tokenizers is not part of strata's set-up: give it a scratch venv,
  python3 -m venv /tmp/tokvenv && /tmp/tokvenv/bin/pip install tokenizers
  RAYON_NUM_THREADS=1 /tmp/tokvenv/bin/python bench/bpe-peer.py
It says so and exits 2 where tokenizers cannot be imported.
"""
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CORPUS = "/usr/share/games/fortunes"


def main():
    try:
        import tokenizers
        from tokenizers import ByteLevelBPETokenizer
    except ImportError:
        print("bpe-peer: Hugging Face tokenizers is not installed here; see this script's docstring")
        return 2
    names = sorted(n for n in os.listdir(CORPUS)
                   if not n.endswith((".dat", ".u8")) and os.path.isfile(os.path.join(CORPUS, n))
                   and not os.path.islink(os.path.join(CORPUS, n)))
    text = "".join(open(os.path.join(CORPUS, n), encoding="utf-8").read() for n in names)
    vocab = os.path.join(ROOT, "tests/data/bpe/vocab.json")
    merges = os.path.join(ROOT, "tests/data/bpe/merges.txt")
    runs = int(os.environ.get("RUNS", "5"))
    nbytes = len(text.encode("utf-8"))
    cold = []
    for _ in range(runs):
        t0 = time.perf_counter()
        tok = ByteLevelBPETokenizer(vocab, merges)
        ids = tok.encode(text).ids
        cold.append(time.perf_counter() - t0)
    warm = []
    for _ in range(runs):
        t0 = time.perf_counter()
        ids = tok.encode(text).ids
        warm.append(time.perf_counter() - t0)
    # tokenizers is built for many short texts: its batch call over the corpus's lines
    # (each line a text; pieces then never span a line end, so the count differs a little).
    lines = text.splitlines(keepends=True)
    batch = []
    for _ in range(runs):
        t0 = time.perf_counter()
        tok = ByteLevelBPETokenizer(vocab, merges)
        n = sum(len(e.ids) for e in tok.encode_batch(lines))
        batch.append(time.perf_counter() - t0)
    rows = (("one text, cold", cold, len(ids)), ("one text, warm", warm, len(ids)),
            ("lines in a batch, cold", batch, n))
    for name, times, count in rows:
        best = min(times)
        print("tokenizers %s, %s: %d bytes -> %d tokens, best of %d %.1f ms, %.1f MB/s, %.2f M tokens/s" %
              (tokenizers.__version__, name, nbytes, count, runs, best * 1e3, nbytes / best / 1e6,
               count / best / 1e6))
    return 0


if __name__ == "__main__":
    sys.exit(main())
