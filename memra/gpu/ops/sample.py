"""Next-token choice on the device: argmax and seeded top-k/top-p/min-p/temperature
sampling (kernels/sample.cu). Both write the token where the next decode step reads it.

    argmax(g, logits, n_vocab, rows, state, part_val, part_idx)
    sample(g, logits, n_vocab, rows, fparams, top_k, seeds, state)

`state` is a `SeqState` of device int32 arrays: tok [rows], pos [rows], step [rows], hist
[rows, hist_len] (or None), and `advance` (1 after a decode step, whose pos[b] is the fed
token's position; 0 when pos[b] already is the chosen token's position). After a launch, for
each row b with pos[b] >= 0 (a row with pos[b] < 0 is padding: untouched): tok[b] = id,
hist[b, step[b]] = id, step[b] += 1, pos[b] += advance.

`reference_sample` reproduces the kernel's rule exactly (see the header of sample.cu):
llama.cpp's order (top-k, top-p, min-p on the untempered distribution, then temperature,
then one draw), masses in 2^-40 fixed point so sums do not depend on order, the draw from
splitmix64(seed, position of the chosen token): a token depends on (logits, seed,
position) only. The check is exact on token ids.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import numpy as np

from memra.errors import MemraError
from memra.gpu.ops import launch_bucket

KERNEL_FILE = "sample.cu"
THREADS = 1024
ARGMAX_BLOCKS = 64  # partial-argmax blocks per row

_NULL = np.uint64(0)
_MASK64 = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15
_FIX = np.float32(2.0 ** 40)


@dataclass
class SeqState:
    tok: object  # DeviceArray int32 [rows]
    step: object  # DeviceArray int32 [rows]
    pos: object  # DeviceArray int32 [rows]
    hist: object = None  # DeviceArray int32 [rows, hist_len] or None
    advance: int = 1

    @property
    def hist_len(self) -> int:
        return self.hist.shape[-1] if self.hist is not None else 0

    def args(self):
        if self.pos is None or self.advance not in (0, 1):
            raise MemraError("sampler state: pos is required and advance is 0 or 1")
        return (self.tok, self.pos, self.step, self.hist if self.hist is not None else _NULL,
                np.int32(self.hist_len), np.int32(self.advance))


def _module(g, canary=False, threads: int = THREADS):
    d = {"SAMPLE_THREADS": threads}
    if canary:
        d["MEMRA_CANARY"] = int(canary)  # 1: sample's draw counter; 2: argmax ties (sample.cu)
    return g.module(KERNEL_FILE, d)


def argmax(g, logits, n_vocab: int, rows: int, state: SeqState, part_val, part_idx,
           pdl: bool = False, canary: bool = False, config: dict | None = None) -> None:
    """config: {"SAMPLE_THREADS": n} (a tuning table's choice; default THREADS). The final
    pass reduces ARGMAX_BLOCKS partials with one thread each, so n >= ARGMAX_BLOCKS."""
    if logits.dtype != np.float32 or part_val.size < rows * ARGMAX_BLOCKS or part_idx.size < rows * ARGMAX_BLOCKS:
        raise MemraError("argmax: float32 logits and scratch of rows * ARGMAX_BLOCKS")
    threads = int((config or {}).get("SAMPLE_THREADS", THREADS))
    if threads < ARGMAX_BLOCKS or threads > 1024 or threads % 32:
        raise MemraError(f"argmax: SAMPLE_THREADS must be a multiple of 32 in {ARGMAX_BLOCKS}..1024, "
                         f"got {threads}")
    m = _module(g, canary, threads)
    g.launch(m.kernel("argmax_partial"), (ARGMAX_BLOCKS, rows), (threads,),
             (logits, np.int32(n_vocab), part_val, part_idx), pdl=pdl)
    g.launch(m.kernel("argmax_final"), (rows,), (threads,),
             (part_val, part_idx, np.int32(ARGMAX_BLOCKS), *state.args()), pdl=pdl)


def sample(g, logits, n_vocab: int, rows: int, fparams, top_k, seeds, state: SeqState,
           pdl: bool = False, canary: bool = False) -> None:
    """fparams: float32 [rows, 3] (temperature, top_p, min_p); top_k: int32 [rows];
    seeds: uint64 [rows]."""
    if fparams.dtype != np.float32 or top_k.dtype != np.int32 or seeds.dtype != np.uint64:
        raise MemraError("sample: fparams float32 [rows, 3], top_k int32, seeds uint64")
    k = _module(g, canary).kernel("sample")
    g.launch(k, (rows,), (THREADS,), (logits, np.int32(n_vocab), fparams, top_k, seeds, *state.args()), pdl=pdl)


# -- references ----------------------------------------------------------------------------

def fkey(x: np.ndarray) -> np.ndarray:
    """Order-preserving u32 key of float32 values."""
    u = np.asarray(x, np.float32).view(np.uint32)
    return np.where(u & np.uint32(0x80000000), ~u, u | np.uint32(0x80000000)).astype(np.uint32)


def _fix(w: np.ndarray) -> np.ndarray:
    return (np.asarray(w, np.float32) * _FIX).astype(np.uint64)


def splitmix64(z: int) -> int:
    z &= _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


def uniform(seed: int, counter: int) -> float:
    return (splitmix64(seed + (counter + 1) * _GOLDEN) >> 11) * (1.0 / 9007199254740992.0)


def reference_argmax(logits: np.ndarray) -> int:
    return int(np.argmax(logits))


def reference_sample(logits, temp: float, top_k: int, top_p: float, min_p: float, seed: int,
                     position: int) -> int:
    """The token the kernel draws for logits whose chosen token takes `position`."""
    l = np.asarray(logits, np.float32)
    n = l.size
    temp, top_p, min_p = np.float32(temp), np.float32(top_p), np.float32(min_p)
    am = int(np.argmax(l))
    M = l[am]
    if not temp > 0 or top_k == 1:
        return am
    keys = fkey(l)
    kmin = np.uint32(0)
    if 0 < top_k < n:
        kmin = np.sort(keys)[::-1][top_k - 1]
    if top_p < 1:
        kk = keys[keys >= kmin]
        w = _fix(np.exp(l[keys >= kmin] - M))
        z = int(w.sum(dtype=np.uint64))
        need = max(1, int(float(top_p) * float(z)))
        order = np.argsort(-kk.astype(np.int64), kind="stable")
        cum = np.cumsum(w[order], dtype=np.uint64)
        kmin = kk[order][int(np.argmax(cum >= np.uint64(need)))]
    keep = keys >= kmin
    if min_p > 0:
        keep &= np.exp(l - M) >= min_p
    w = np.where(keep, _fix(np.exp((l - M) / temp)), np.uint64(0)).astype(np.uint64)
    W = int(w.sum(dtype=np.uint64))
    target = min(int(uniform(seed, position) * float(W)), W - 1)
    cum = np.cumsum(w, dtype=np.uint64)
    return int(np.argmax(cum > np.uint64(target)))


# -- kernel-check ------------------------------------------------------------------------

PARAMS = (  # temperature, top_k, top_p, min_p
    (0.8, 40, 0.95, 0.05),  # llama.cpp's defaults
    (1.0, 0, 1.0, 0.0),     # the plain distribution
    (0.7, 0, 0.9, 0.0),     # top-p over the whole vocabulary
    (1.5, 100, 1.0, 0.1),   # top-k + min-p
    (1.0, 5, 0.5, 0.0),
    (0.0, 40, 0.95, 0.05),  # greedy
    (1.2, 1, 1.0, 0.0),     # top-1 = greedy
)


def compile_variants():
    return [(KERNEL_FILE, {"SAMPLE_THREADS": THREADS}), (KERNEL_FILE, {"SAMPLE_THREADS": THREADS, "MEMRA_CANARY": 1}),
            (KERNEL_FILE, {"SAMPLE_THREADS": THREADS, "MEMRA_CANARY": 2})]


def _logits(rng, rows, n, ties: bool):
    x = (rng.standard_normal((rows, n)) * rng.uniform(1, 4)).astype(np.float32)
    if ties:  # the maximum appears several times: the smallest index must win
        for r in range(rows):
            idx = rng.choice(n, 3, replace=False)
            x[r, idx] = x[r].max() + 1
    return x


def _state(g, rng, rows, hist_len=16, advance=1, padded=()):
    """Random row state; rows in `padded` get position -1 (nothing may change for them)."""
    step = rng.integers(0, hist_len, rows).astype(np.int32)
    pos = rng.integers(0, 1000, rows).astype(np.int32)
    pos[list(padded)] = -1
    st = SeqState(tok=g.empty(rows, np.int32), step=g.to_device(step), pos=g.to_device(pos),
                  hist=g.empty((rows, hist_len), np.int32), advance=advance)
    st.tok.fill_bytes(0x7E)  # 0x7E7E7E7E: not a token id of any vocabulary
    st.hist.fill_bytes(0x7F)
    return st, step, pos


def _verify_state(name, st, step, pos, expect):
    """expect: the reference token of every row (ignored for padded rows, pos < 0)."""
    from memra.gpu.compare import Outcome

    tok, s2, p2, hist = st.tok.numpy(), st.step.numpy(), st.pos.numpy(), st.hist.numpy()
    live = pos >= 0
    exp = np.where(live, np.asarray(expect, np.int64), 0x7E7E7E7E).astype(np.int32)
    if not np.array_equal(tok, exp):
        bad = np.flatnonzero(tok != exp)
        return Outcome(name, False, f"{bad.size} of {exp.size} tokens differ (row {bad[0]}: got {tok[bad[0]]}, "
                                    f"reference {exp[bad[0]]})")
    adv = st.advance * live
    if not (np.array_equal(s2, step + live) and np.array_equal(p2, pos + adv)):
        return Outcome(name, False, f"step/pos not advanced as committed (advance {st.advance}, padded rows kept)")
    rows = np.arange(len(exp))
    if not np.array_equal(hist[rows[live], step[live]], exp[live]) or \
            np.any(hist[rows[~live]] != 0x7F7F7F7F):
        return Outcome(name, False, "history not written at step (or written for a padded row)")
    return Outcome(name, True, f"{int(live.sum())} tokens exact, {int((~live).sum())} padded rows untouched")


def _check_argmax(g, rng, rows, n, canary=False, config=None):
    x = _logits(rng, rows, n, ties=True)
    st, step, pos = _state(g, rng, rows, padded=(rows - 1,) if rows > 2 else ())
    pv, pi = g.empty(rows * ARGMAX_BLOCKS, np.float32), g.empty(rows * ARGMAX_BLOCKS, np.int32)
    argmax(g, g.to_device(x), n, rows, st, pv, pi, canary=canary, config=config)
    return _verify_state(f"argmax rows={rows} n={n} (tied maxima)", st, step, pos,
                         [reference_argmax(r) for r in x])


def _check_sample(g, rng, n, params, canary=False, advance=1):
    rows = len(params)
    x = _logits(rng, rows, n, ties=False)
    st, step, pos = _state(g, rng, rows, advance=advance, padded=(1,) if rows > 2 else ())
    fp = np.array([[p[0], p[2], p[3]] for p in params], np.float32)
    tk = np.array([p[1] for p in params], np.int32)
    seeds = rng.integers(0, 2 ** 63, rows, dtype=np.int64).astype(np.uint64)
    sample(g, g.to_device(x), n, rows, g.to_device(fp), g.to_device(tk), g.to_device(seeds), st, canary=canary)
    ref = [reference_sample(x[r], *[params[r][i] for i in (0, 1, 2, 3)], int(seeds[r]), int(pos[r]) + advance)
           for r in range(rows)]
    return _verify_state(f"sample rows={rows} n={n} advance={advance}", st, step, pos, ref)


def checks(g, rng: np.random.Generator) -> Iterator:
    for rows, n in ((1, 49152), (3, 262144), (2, 1000)):
        yield _check_argmax(g, rng, rows, n)
    for n in (1000, 49152, 262144):
        for advance in (1, 0):
            yield _check_sample(g, rng, n, PARAMS, advance=advance)


def canaries(g, rng: np.random.Generator) -> Iterator:
    yield _check_sample(g, rng, 1000, [(1.0, 0, 1.0, 0.0)] * 6, canary=1)
    yield _check_argmax(g, rng, 3, 49152, canary=2)


# -- the launch set (memra.tune.launches) ---------------------------------------------------

def launch_cases(L, ctx) -> list[dict]:
    """A plan launch of op "argmax" (argmax_partial + argmax_final, the table's
    SAMPLE_THREADS) or "sample" over the vocabulary."""
    n, rows = int(L.shape["n"]), int(L.rows)
    b = launch_bucket(rows)
    if L.op == "argmax":
        threads = int((L.config or {}).get("SAMPLE_THREADS", THREADS))
        return [{"file": KERNEL_FILE, "entry": "argmax_partial+argmax_final", "defines": {"SAMPLE_THREADS": threads},
                 "bucket": b, "tag": f"n{n}", "params": {"n": n, "rows": b, "config": dict(L.config or {}) or None}}]
    return [{"file": KERNEL_FILE, "entry": "sample", "defines": {"SAMPLE_THREADS": THREADS}, "bucket": b,
             "tag": f"n{n}", "params": {"n": n, "rows": b}}]


def check_launch(g, rng, case):
    p = case["params"]
    if case["entry"] == "sample":
        return _check_sample(g, rng, p["n"], [PARAMS[i % len(PARAMS)] for i in range(max(p["rows"], 1))])
    return _check_argmax(g, rng, max(p["rows"], 1), p["n"], config=p["config"])


# -- tune hook (memra/tune/measure.py): kernel "argmax", variant "default", shape {n}, batch rows

# the kernels tune_case measures and their variants (memra tune run checks a campaign's names against them)
TUNE_VARIANTS = {"argmax": ("default",)}


def tune_case(g, kernel: str, variant: str, config: dict, shape: dict, rng, rotate_bytes: int):
    if variant not in TUNE_VARIANTS.get(kernel, ()):
        raise MemraError(f"sample tune: unknown kernel/variant {kernel}/{variant}")
    return _TuneCase(g, dict(config or {}), int(shape["n"]), int(shape.get("batch", 1)), rng, rotate_bytes)


class _TuneCase:
    """`sets` copies of [rows, n] logits (tied maxima included); one token state, as in the
    engine's decode graph (tok/step/pos advanced by every launch, no history)."""

    def __init__(self, g, config, n, rows, rng, rotate_bytes):
        self.g, self.config, self.n, self.rows = g, config, n, rows
        one = rows * n * 4
        self.sets = max(1, -(-rotate_bytes // one))
        self.logits = _logits(rng, rows, n, ties=True)
        self.buf = g.to_device(np.tile(self.logits.reshape(1, -1), (self.sets, 1)))
        self.pv = g.empty(rows * ARGMAX_BLOCKS, np.float32)
        self.pi = g.empty(rows * ARGMAX_BLOCKS, np.int32)
        self.st, self.step, self.pos = _state(g, rng, rows)
        self.st.hist = None
        self.bytes = one + 8 * rows * ARGMAX_BLOCKS + 12 * rows

    def launch(self, i: int) -> None:
        x = self.buf.view(np.float32, (self.rows, self.n), 4 * self.rows * self.n * i)
        argmax(self.g, x, self.n, self.rows, self.st, self.pv, self.pi, config=self.config)

    def check(self):
        self.st.tok.poison()
        self.st.step.upload(self.step)
        self.st.pos.upload(self.pos)
        self.launch(0)
        self.g.sync()
        tok = self.st.tok.numpy()
        ref = np.array([reference_argmax(r) for r in self.logits], np.int32)
        bad = int(np.count_nonzero(tok != ref))
        ok = bad == 0 and np.array_equal(self.st.step.numpy(), self.step + 1) \
            and np.array_equal(self.st.pos.numpy(), self.pos + 1)
        detail = (f"{bad} of {ref.size} tokens differ" if bad else
                  "tokens exact" if ok else "step/pos not advanced by one")
        return ok, 0.0 if ok else float("inf"), detail
