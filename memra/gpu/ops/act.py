"""Gated activations (SiLU, GELU-tanh) and the logit soft-cap (kernels/act.cu).

    act_mul(g, gate, up, out, n, rows, act, gate_stride=n, up_stride=n, out_stride=n, config=None)
    softcap(g, x, n, cap)

References: memra.cpu.reference.silu / gelu_tanh. Tolerance 1e-5 relative.
"""

from __future__ import annotations

from typing import Iterator

import numpy as np

from memra.errors import MemraError
from memra.gpu.ops import launch_bucket

KERNEL_FILE = "act.cu"
THREADS = 256
TOL = 1e-5
ACTS = {"silu": 0, "gelu_tanh": 1}


def _threads(config: dict | None) -> int:
    t = int((config or {}).get("ACT_THREADS", THREADS))
    if t < 32 or t > 1024 or t % 32:
        raise MemraError(f"act: ACT_THREADS must be a multiple of 32 in 32..1024, got {t}")
    return t


def _module(g, canary=False, threads: int = THREADS):
    d = {"ACT_THREADS": threads}
    if canary:
        d["MEMRA_CANARY"] = 1
    return g.module(KERNEL_FILE, d)


def act_mul(g, gate, up, out, n: int, rows: int, act: str, gate_stride: int | None = None,
            up_stride: int | None = None, out_stride: int | None = None, pdl: bool = False,
            canary: bool = False, config: dict | None = None) -> None:
    """out = act(gate) * up over `rows` rows of n. config: {"ACT_THREADS": n} (a tuning
    table's choice; default THREADS)."""
    if act not in ACTS:
        raise MemraError(f"unknown activation {act!r} (known: {', '.join(ACTS)})")
    for a in (gate, up, out):
        if a.dtype != np.float32:
            raise MemraError("act_mul takes float32 arrays")
    threads = _threads(config)
    k = _module(g, canary, threads).kernel("act_mul")
    g.launch(k, ((n + threads - 1) // threads, rows), (threads,),
             (gate, up, out, np.int32(n), np.int32(gate_stride or n), np.int32(up_stride or n),
              np.int32(out_stride or n), np.int32(ACTS[act])), pdl=pdl)


def act_mul_of(g, gate_up: np.ndarray, act: str) -> np.ndarray:
    """act_mul on the device of a host [nb, 2N] float32 array holding each row's gate (first N) and up outputs: the
    bits a matmul family's glu epilogue must equal (its oracle in kernel-check: the plain kernel's outputs of the
    same weight, through the engine's own activation)."""
    nb, rows = gate_up.shape
    N = rows // 2
    d = g.to_device(np.ascontiguousarray(gate_up, np.float32))
    out = g.empty((nb, N), np.float32)
    act_mul(g, d.view(np.float32, (nb * rows,), 0), d.view(np.float32, (nb * rows - N,), 4 * N), out, N, nb, act,
            gate_stride=rows, up_stride=rows, out_stride=N)
    g.sync()
    return out.numpy()


def softcap(g, x, n: int, cap: float, rows: int = 1, pdl: bool = False, canary: bool = False) -> None:
    k = _module(g, canary).kernel("softcap")
    g.launch(k, ((n * rows + THREADS - 1) // THREADS,), (THREADS,), (x, np.int32(n * rows), np.float32(cap)),
             pdl=pdl)


def reference(gate, up, act: str) -> np.ndarray:
    from memra.cpu.reference import gelu_tanh, silu

    gate = np.asarray(gate, np.float32)
    return (gelu_tanh(gate) if act == "gelu_tanh" else silu(gate)) * np.asarray(up, np.float32)


# -- kernel-check ------------------------------------------------------------------------

def compile_variants():
    return [(KERNEL_FILE, {"ACT_THREADS": THREADS}), (KERNEL_FILE, {"ACT_THREADS": THREADS, "MEMRA_CANARY": 1})]


def _check(g, rng, act, rows, n, fused: bool, canary=False):
    from memra.gpu.compare import compare

    # fused: gate and up are the two halves of one [rows, 2n] buffer (a fused gate+up matvec)
    gu = (rng.standard_normal((rows, 2 * n)) * 3).astype(np.float32)
    d_gu = g.to_device(gu)
    out = g.empty((rows, n), np.float32)
    out.poison()
    if fused:
        act_mul(g, d_gu, d_gu.view(offset=4 * n), out, n, rows, act, 2 * n, 2 * n, n, canary=canary)
        ref = reference(gu[:, :n], gu[:, n:], act)
    else:
        d_up = g.to_device(np.ascontiguousarray(gu[:, n:]))
        d_gate = g.to_device(np.ascontiguousarray(gu[:, :n]))
        act_mul(g, d_gate, d_up, out, n, rows, act, canary=canary)
        ref = reference(gu[:, :n], gu[:, n:], act)
    return compare(f"act_mul {act} rows={rows} n={n}{' fused' if fused else ''}", out.numpy(), ref, TOL)


def _check_softcap(g, rng, rows=1, n=5000, cap=30.0, canary=False):
    """softcap works in place, so its output cannot be poisoned: every input is drawn with
    |x| in [cap / 2, 4 cap], where cap * tanh(x / cap) differs from x by at least 3.8 % of
    cap, and the comparison is per element (max |got - ref| / max |ref|): a value the
    kernel left unwritten fails it."""
    from memra.gpu.compare import compare

    x = (rng.uniform(0.5, 4.0, (rows, n)) * rng.choice([-1.0, 1.0], (rows, n)) * cap).astype(np.float32)
    d = g.to_device(x)
    softcap(g, d, n, cap, rows, canary=canary)
    ref = np.tanh(x / np.float32(cap)) * np.float32(cap)
    return compare(f"softcap rows={rows} n={n} cap={cap:g}", d.numpy(), ref, TOL, kind="max")


def checks(g, rng: np.random.Generator) -> Iterator:
    for act in ACTS:
        yield _check(g, rng, act, 1, 1536, fused=False)
        yield _check(g, rng, act, 3, 2048, fused=True)
    yield _check_softcap(g, rng)
    yield _check_softcap(g, rng, rows=3, n=2000, cap=15.0)


def canaries(g, rng: np.random.Generator) -> Iterator:
    yield _check(g, rng, "gelu_tanh", 2, 1000, fused=True, canary=True)
    yield _check_softcap(g, rng, rows=2, n=1000, canary=True)


# -- the launch set (memra.tune.launches) ---------------------------------------------------

def launch_cases(L, ctx) -> list[dict]:
    """A plan launch of op "act_mul" (gate and up apart: the activation written over the gate,
    as runner's act_mul(ff, ff2, ff)) or "softcap" (the logits, in place)."""
    rows = int(L.rows)
    b = launch_bucket(rows)
    if L.op == "softcap":
        n, cap = int(L.shape["n"]), float(ctx.cfg.final_logit_softcap)
        return [{"file": KERNEL_FILE, "entry": "softcap", "defines": {"ACT_THREADS": THREADS}, "bucket": b,
                 "tag": f"n{n}", "params": {"n": n, "rows": b, "cap": cap}}]
    n, act = int(L.shape["n"]), getattr(ctx.cfg, "act", "silu")
    return [{"file": KERNEL_FILE, "entry": "act_mul", "defines": {"ACT_THREADS": _threads(L.config)}, "bucket": b,
             "tag": f"n{n} {act} out=gate", "params": {"n": n, "rows": b, "act": act,
                                                        "config": dict(L.config) if L.config else None}}]


def check_launch(g, rng, case):
    from memra.gpu.compare import compare

    p = case["params"]
    if case["entry"] == "softcap":
        return _check_softcap(g, rng, rows=p["rows"], n=p["n"], cap=p["cap"])
    n, rows, act = p["n"], p["rows"], p["act"]
    gate = (rng.standard_normal((rows, n)) * 3).astype(np.float32)
    up = (rng.standard_normal((rows, n)) * 3).astype(np.float32)
    d_gate, d_up = g.to_device(gate), g.to_device(up)
    # out is the gate buffer (unpoisonable): act(g) * up differs from g almost everywhere, and
    # the L2 comparison fails on one unwritten value of a row (~1 / sqrt(n) relative)
    act_mul(g, d_gate, d_up, d_gate, n, rows, act, config=p["config"])
    return compare(f"act_mul {act} rows={rows} n={n} out=gate {case['defines']}", d_gate.numpy(),
                   reference(gate, up, act), TOL)


# -- tune hook (memra/tune/measure.py): kernel "act_mul", variant "default", shape {n}, batch rows

# the kernels tune_case measures and their variants (memra tune run checks a campaign's names against them)
TUNE_VARIANTS = {"act_mul": ("default",)}


def tune_case(g, kernel: str, variant: str, config: dict, shape: dict, rng, rotate_bytes: int):
    if variant not in TUNE_VARIANTS.get(kernel, ()):
        raise MemraError(f"act tune: unknown kernel/variant {kernel}/{variant}")
    return _TuneCase(g, dict(config or {}), int(shape["n"]), int(shape.get("batch", 1)), rng, rotate_bytes)


class _TuneCase:
    """gate and up as the engine has them when the FFN is not fused (two [rows, n] buffers),
    `sets` copies of both in one allocation; the output is written in place of the gate,
    as in the engine, so each launch reads and writes its copy."""

    def __init__(self, g, config, n, rows, rng, rotate_bytes):
        self.g, self.config, self.n, self.rows = g, config, n, rows
        _threads(config)  # a bad value fails here, recorded as a failed configuration
        one = rows * n * 4
        self.bytes = 3 * one
        self.sets = max(1, -(-rotate_bytes // (2 * one)))
        self.act = "silu"
        host = (rng.standard_normal((2, rows, n)) * 3).astype(np.float32)
        # every copy starts from the same values (only the addresses matter for timing)
        self.buf = g.to_device(np.tile(host.reshape(1, -1), (self.sets, 1)))
        self.host = host

    def _arrays(self, i):
        one = self.rows * self.n * 4
        gate = self.buf.view(np.float32, (self.rows, self.n), 2 * one * i)
        up = self.buf.view(np.float32, (self.rows, self.n), 2 * one * i + one)
        return gate, up

    def launch(self, i: int) -> None:
        gate, up = self._arrays(i)
        act_mul(self.g, gate, up, gate, self.n, self.rows, self.act, config=self.config)

    def check(self):
        from memra.gpu.compare import compare

        gate, up = self.g.to_device(self.host[0]), self.g.to_device(self.host[1])
        out = self.g.empty((self.rows, self.n), np.float32)
        out.poison()
        act_mul(self.g, gate, up, out, self.n, self.rows, self.act, config=self.config)
        self.g.sync()
        o = compare("act_mul", out.numpy(), reference(self.host[0], self.host[1], self.act), TOL)
        return o.ok, o.err, o.detail
