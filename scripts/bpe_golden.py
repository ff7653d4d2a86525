#!/usr/bin/env python3
"""Writes the golden data of strata's GPT-2 byte-level BPE (tests/data/bpe/).

Hugging Face's `tokenizers` (PyPI, not needed by the build or the tests) is the reference:
its ByteLevelBPETokenizer pre-tokenises with GPT-2's pattern and saves vocab.json and
merges.txt in GPT-2's format. This script trains a small vocabulary on Debian's fortunes
corpus, saves it, and records the reference's encoding of
  - a list of short strings that exercise the pattern (contractions, numbers, Unicode
    letters and marks, punctuation runs, whitespace runs, emoji), and
  - the whole default corpus (every file of /usr/share/games/fortunes that
    `strata data prepare` reads, concatenated in name order): its token count and the
    FNV-1a 64 hash of the ids as little-endian uint32, so the test needs no copy of it.

Usage (once, then commit tests/data/bpe):
  python3 -m venv /tmp/tokvenv && /tmp/tokvenv/bin/pip install tokenizers
  /tmp/tokvenv/bin/python scripts/bpe_golden.py tests/data/bpe
"""
import json
import os
import struct
import sys

import tokenizers
from tokenizers import ByteLevelBPETokenizer

CORPUS_DIR = "/usr/share/games/fortunes"
VOCAB_SIZE = 2000

STRINGS = [
    "Hello, world!",
    "I'll be there; they're not. You've seen it, she'd say, it's mine, we'm",
    "DON'T SHOUT'S",
    "The year 1984 had 366 days? No: 365.25 on average; pi=3.14159",
    "naïve café, Ünïcödé, straße, Ελληνικά, русский, 日本語のテキスト",
    "e\u0301 (combining acute) and \u00e9 (precomposed)",
    "emoji 🙂🚀 and symbols ™ © ½ →",
    "a   b\n\n  c\t\td  \n",
    "trailing spaces    ",
    "   leading spaces",
    "!!!...???---***",
    "tabs\tand\r\nwindows\r\nline ends",
    "\u00a0non-breaking\u2003em-space\u3000ideographic",
    "",
    " ",
    "x",
    "mixed123abc456 789xyz",
    "fortune: % \n%\nA man's gotta do what a man's gotta do.\n",
]


def corpus_files():
    names = sorted(os.listdir(CORPUS_DIR))
    out = []
    for n in names:
        p = os.path.join(CORPUS_DIR, n)
        if n.endswith(".dat") or n.endswith(".u8") or os.path.islink(p) or not os.path.isfile(p):
            continue
        out.append(p)
    return out


def fnv1a64_ids(ids):
    h = 0xCBF29CE484222325
    for b in struct.pack("<%dI" % len(ids), *ids):
        h ^= b
        h = (h * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def main():
    out_dir = sys.argv[1]
    os.makedirs(out_dir, exist_ok=True)
    files = corpus_files()
    tok = ByteLevelBPETokenizer()
    tok.train(files, vocab_size=VOCAB_SIZE, min_frequency=2, show_progress=False)
    tok.save_model(out_dir)
    # Reload from the saved files, so the golden ids are those of the files committed.
    tok = ByteLevelBPETokenizer(os.path.join(out_dir, "vocab.json"), os.path.join(out_dir, "merges.txt"))
    text = "".join(open(f, encoding="utf-8").read() for f in files)
    corpus_ids = tok.encode(text).ids
    golden = {
        "reference": "tokenizers %s ByteLevelBPETokenizer" % tokenizers.__version__,
        "strings": [{"text": s, "ids": tok.encode(s).ids} for s in STRINGS],
        "corpus": {
            "dir": CORPUS_DIR,
            "files": [os.path.basename(f) for f in files],
            "bytes": len(text.encode("utf-8")),
            "tokens": len(corpus_ids),
            "fnv1a64": "%016x" % fnv1a64_ids(corpus_ids),
        },
    }
    with open(os.path.join(out_dir, "golden.json"), "w", encoding="utf-8") as f:
        json.dump(golden, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print("%s: vocab %d, corpus %d bytes -> %d tokens" % (out_dir, tok.get_vocab_size(), golden["corpus"]["bytes"],
                                                       len(corpus_ids)))


if __name__ == "__main__":
    main()
