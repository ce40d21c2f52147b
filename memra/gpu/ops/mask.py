"""Constrained decoding on the device: a row's vocabulary bitmask applied to its logits
before the sampler (kernels/mask.cu), inside the captured decode graph.

    apply_mask(g, logits, n_vocab, rows, mask, pos)   # logits [rows, n] float32, in place

`mask` is a device int32/uint32 [rows, words] array (words = ceil(n_vocab / 32); bit i of a
row is bit i % 32 of word i // 32, llguidance's layout, which memra.text.grammar fills);
`pos` the decode state's positions (rows with pos < 0 are padding: untouched) or None.
After the launch every disallowed logit is -inf and every allowed one is unchanged, so
argmax and the seeded sampler (kernels/sample.cu) choose among the allowed tokens by the
same rule as an unconstrained row. The check is exact (bit for bit), as the reference
`reference_mask` is memra.text.grammar.masked.
"""

from __future__ import annotations

from typing import Iterator

import numpy as np

from memra.errors import MemraError
from memra.gpu.ops import launch_bucket

KERNEL_FILE = "mask.cu"
THREADS = 256
_NULL = np.uint64(0)


def words_of(n_vocab: int) -> int:
    return (int(n_vocab) + 31) // 32


def _module(g, canary=False, threads: int = THREADS):
    d = {"MASK_THREADS": threads}
    if canary:
        d["MEMRA_CANARY"] = int(canary)
    return g.module(KERNEL_FILE, d)


def apply_mask(g, logits, n_vocab: int, rows: int, mask, pos=None, pdl: bool = False,
               canary: bool = False) -> None:
    """Disallowed logits of each live row to -inf, in place."""
    words = words_of(n_vocab)
    if logits.dtype != np.float32 or mask.dtype not in (np.int32, np.uint32):
        raise MemraError("apply_mask: float32 logits and an int32/uint32 mask")
    if mask.size < rows * words or logits.size < rows * n_vocab:
        raise MemraError(f"apply_mask: {rows} rows need a mask of {rows * words} words and "
                         f"{rows * n_vocab} logits (got {mask.size} and {logits.size})")
    if pos is not None and (pos.dtype != np.int32 or pos.size < rows):
        raise MemraError("apply_mask: pos is int32 [rows]")
    k = _module(g, canary).kernel("apply_mask")
    g.launch(k, (-(-words // THREADS), rows), (THREADS,),
             (logits, np.int32(n_vocab), mask, np.int32(words), pos if pos is not None else _NULL), pdl=pdl)


# -- reference ---------------------------------------------------------------------------------

def reference_mask(logits: np.ndarray, mask: np.ndarray, pos: np.ndarray | None = None) -> np.ndarray:
    """[rows, n] logits after the kernel: disallowed tokens of live rows at -inf."""
    x = np.array(logits, np.float32, copy=True)
    rows, n = x.shape
    bits = np.unpackbits(np.ascontiguousarray(mask[:rows]).view(np.uint8).reshape(rows, -1), axis=1,
                         bitorder="little")[:, :n].astype(bool)
    live = np.ones(rows, bool) if pos is None else np.asarray(pos[:rows]) >= 0
    x[live[:, None] & ~bits] = -np.inf
    return x


# -- kernel-check ----------------------------------------------------------------------------------

def compile_variants():
    return [(KERNEL_FILE, {"MASK_THREADS": THREADS}), (KERNEL_FILE, {"MASK_THREADS": THREADS, "MEMRA_CANARY": 1})]


def _masks(rng, rows: int, n: int) -> np.ndarray:
    """Masks as constrained rows have them: a few allowed tokens (one row), a random half,
    everything allowed (an unconstrained row sharing the batch), nothing but the last token
    (the vocabulary's tail word), cycling."""
    words = words_of(n)
    m = np.zeros((rows, words), np.uint32)
    for r in range(rows):
        kind = r % 4
        if kind == 0:
            ids = rng.choice(n, min(n, 5), replace=False)
        elif kind == 1:
            ids = np.flatnonzero(rng.random(n) < 0.5)
        elif kind == 2:
            m[r] = 0xFFFFFFFF
            continue
        else:
            ids = np.array([n - 1])
        np.bitwise_or.at(m[r], ids // 32, (np.uint32(1) << (ids % 32).astype(np.uint32)))
    return m


def _check(g, rng, rows: int, n: int, canary=False, padded=()):
    from memra.gpu.compare import Outcome

    x = (rng.standard_normal((rows, n)) * 3).astype(np.float32)
    m = _masks(rng, rows, n)
    pos = rng.integers(0, 1000, rows).astype(np.int32)
    pos[list(padded)] = -1
    d = g.to_device(x)
    apply_mask(g, d, n, rows, g.to_device(m), g.to_device(pos), canary=canary)
    got = d.numpy()
    ref = reference_mask(x, m, pos)
    name = f"apply_mask rows={rows} n={n}" + (f" ({len(padded)} padded)" if padded else "")
    if np.array_equal(got.view(np.uint32), ref.view(np.uint32)):
        return Outcome(name, True, f"bit-exact; {int(np.isinf(ref).sum())} logits masked", 0.0)
    bad = np.argwhere(got.view(np.uint32) != ref.view(np.uint32))
    r, i = bad[0]
    return Outcome(name, False, f"{len(bad)} logits differ (row {r} token {i}: got {got[r, i]}, "
                                f"reference {ref[r, i]})")


def checks(g, rng: np.random.Generator) -> Iterator:
    for rows, n in ((1, 49152), (4, 1000), (8, 128256), (16, 262144), (3, 33)):
        yield _check(g, rng, rows, n, padded=(rows - 1,) if rows > 2 else ())


def canaries(g, rng: np.random.Generator) -> Iterator:
    yield _check(g, rng, 4, 49152, canary=1)


# -- the launch set (memra.tune.launches) -----------------------------------------------------

def launch_cases(L, ctx) -> list[dict]:
    """A plan launch of op "mask" over the vocabulary."""
    n, rows = int(L.shape["n"]), int(L.rows)
    b = launch_bucket(rows)
    return [{"file": KERNEL_FILE, "entry": "apply_mask", "defines": {"MASK_THREADS": THREADS}, "bucket": b,
             "tag": f"n{n}", "params": {"n": n, "rows": b}}]


def check_launch(g, rng, case):
    p = case["params"]
    return _check(g, rng, max(p["rows"], 1), p["n"], padded=(p["rows"] - 1,) if p["rows"] > 2 else ())
