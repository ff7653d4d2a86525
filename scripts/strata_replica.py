"""strata's deterministic pieces, replicated in numpy for scripts/gpt_torch_peer.py: the
SplitMix64 hashes behind the batches' sample starts (src/model/model.cc,
src/model/token_data.cc), the GPT's tensors and their GPT-2 initialisation
(include/strata/gpt.h, src/model/gpt.cc), and the token file reader
(include/strata/token_data.h). python/tests/test_gpt_torch_peer.py pins them to values
the C++ printed.
"""

from __future__ import annotations

import math
import struct
from pathlib import Path

import numpy as np

MASK64 = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15
SAMPLE_STREAM = 0x746F6B656E730000  # token_data.cc's kSampleStream
TOKEN_MAGIC = b"STRTOKN\0"
TOKEN_HEADER_BYTES = 64


# ---- the hashes (src/model/model.cc, src/model/token_data.cc) -------------------------


def mix64(z: int) -> int:
    """SplitMix64's finaliser on a Python int, mod 2^64."""
    z &= MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31)


def _mix64_np(z: np.ndarray) -> np.ndarray:
    """mix64 over a uint64 array (numpy's uint64 arithmetic wraps mod 2^64)."""
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def _hash_np(seed: int, stream: int, index: np.ndarray) -> np.ndarray:
    """Mix(Mix(Mix(seed + golden) ^ stream) + index * golden) over a uint64 array."""
    base = np.uint64(mix64(mix64(seed + GOLDEN) ^ (stream & MASK64)))
    with np.errstate(over="ignore"):
        return _mix64_np(base + index.astype(np.uint64) * np.uint64(GOLDEN))


def sample_start(seed: int, sample: int, file_size: int, seq: int) -> int:
    """model::SampleStart: where sample `sample` starts, in [0, file_size - seq - 1]."""
    if not (seq >= 1 and file_size > seq):
        raise ValueError(f"SampleStart needs file_size > seq >= 1, got {file_size}, {seq}")
    h = mix64(((mix64(mix64(seed + GOLDEN) ^ SAMPLE_STREAM)) + (sample & MASK64) * GOLDEN) & MASK64)
    return h % (file_size - seq)


def sample_starts(seed: int, first: int, count: int, file_size: int, seq: int) -> np.ndarray:
    """SampleStart of samples [first, first + count), as int64."""
    if not (seq >= 1 and file_size > seq):
        raise ValueError(f"SampleStart needs file_size > seq >= 1, got {file_size}, {seq}")
    h = _hash_np(seed, SAMPLE_STREAM, np.arange(first, first + count, dtype=np.uint64))
    return (h % np.uint64(file_size - seq)).astype(np.int64)


def hash_uniform(seed: int, stream: int, index: np.ndarray) -> np.ndarray:
    """model::HashUniform: 24 bits -> [-1, 1), float32 (the C++'s float arithmetic is exact)."""
    h = _hash_np(seed, stream, index)
    return ((h >> np.uint64(40)).astype(np.float32) * np.float32(2.0 / 16777216.0) - np.float32(1.0)).astype(
        np.float32
    )


# ---- the model's tensors and their init (include/strata/gpt.h, src/model/gpt.cc) -----

BLOCK_TENSORS = (  # GptBlockTensor order; (name, init kind)
    ("ln1.weight", "one"),
    ("ln1.bias", "zero"),
    ("attn.qkv.weight", "normal"),
    ("attn.qkv.bias", "zero"),
    ("attn.proj.weight", "residual"),
    ("attn.proj.bias", "zero"),
    ("ln2.weight", "one"),
    ("ln2.bias", "zero"),
    ("mlp.fc.weight", "normal"),
    ("mlp.fc.bias", "zero"),
    ("mlp.proj.weight", "residual"),
    ("mlp.proj.bias", "zero"),
)


def tensor_specs(vocab: int, block: int, n_layer: int, n_embd: int, tied: bool = True):
    """[(strata name, shape, init kind)] in GptModel's tensor-id order."""
    c = n_embd
    shapes = {
        "attn.qkv.weight": (3 * c, c),
        "attn.qkv.bias": (3 * c,),
        "attn.proj.weight": (c, c),
        "mlp.fc.weight": (4 * c, c),
        "mlp.fc.bias": (4 * c,),
        "mlp.proj.weight": (c, 4 * c),
    }
    out = [("wte", (vocab, c), "normal"), ("wpe", (block, c), "normal")]
    for layer in range(n_layer):
        for name, kind in BLOCK_TENSORS:
            out.append((f"h{layer}.{name}", shapes.get(name, (c,)), kind))
    out += [("lnf.weight", (c,), "one"), ("lnf.bias", (c,), "zero")]
    if not tied:
        out.append(("lm_head.weight", (vocab, c), "normal"))
    return out


def init_tensor(seed: int, tensor_id: int, kind: str, shape, n_layer: int, chunk: int = 1 << 22) -> np.ndarray:
    """InitGptTensor of a whole tensor, as float32 of `shape`."""
    n = int(np.prod(shape))
    if kind in ("zero", "one"):
        return np.full(shape, 1.0 if kind == "one" else 0.0, dtype=np.float32)
    std = 0.02 if kind == "normal" else 0.02 / math.sqrt(2.0 * n_layer)
    stream = tensor_id + 1
    out = np.empty(n, dtype=np.float32)
    two_pi = 2.0 * math.pi
    for begin in range(0, n, chunk):
        i = np.arange(begin, min(n, begin + chunk), dtype=np.uint64) * np.uint64(2)
        u1 = (1.0 - hash_uniform(seed, stream, i).astype(np.float64)) / 2.0
        u2 = (1.0 + hash_uniform(seed, stream, i + np.uint64(1)).astype(np.float64)) / 2.0
        z = np.sqrt(-2.0 * np.log(u1)) * np.cos(two_pi * u2)
        out[begin : begin + len(i)] = (std * z).astype(np.float32)
    return out.reshape(shape)


# ---- token files (include/strata/token_data.h) -----------------------------------------


def _fnv1a64(data: bytes) -> int:
    h = 0xCBF29CE484222325
    for b in data:
        h = ((h ^ b) * 0x100000001B3) & MASK64
    return h


class TokenFile:
    """A strata token file (format version 1), its tokens memory-mapped."""

    def __init__(self, path):
        self.path = str(path)
        try:
            with open(path, "rb") as f:
                head = f.read(TOKEN_HEADER_BYTES)
        except FileNotFoundError:
            raise SystemExit(f"{path}: token file does not exist (run `strata data prepare`)") from None
        if len(head) < TOKEN_HEADER_BYTES or head[:8] != TOKEN_MAGIC:
            raise SystemExit(f"{path}: not a strata token file")
        version, width, vocab, count = struct.unpack_from("<IIQQ", head, 8)
        (checksum,) = struct.unpack_from("<Q", head, 56)
        if version != 1 or checksum != _fnv1a64(head[:56]) or width not in (2, 4):
            raise SystemExit(f"{path}: unsupported version {version}, width {width} or bad header checksum")
        size = Path(path).stat().st_size
        if size != TOKEN_HEADER_BYTES + count * width:
            raise SystemExit(f"{path}: {size} bytes, the header's {count} tokens need {64 + count * width}")
        self.vocab, self.size = vocab, count
        dtype = np.dtype("<u2") if width == 2 else np.dtype("<u4")
        self.tokens = np.memmap(path, dtype=dtype, mode="r", offset=TOKEN_HEADER_BYTES, shape=(count,))

    def batch(self, seed: int, first: int, count: int, seq: int):
        """FillBatch: samples [first, first + count) -> (tokens, targets), int64 arrays [count, seq]."""
        starts = sample_starts(seed, first, count, self.size, seq)
        win = np.stack([np.asarray(self.tokens[p : p + seq + 1], dtype=np.int64) for p in starts])
        return win[:, :seq].copy(), win[:, 1:].copy()
