"""RMSNorm, alone and fused with the residual add (kernels/norm.cu).

    rmsnorm(g, x, w, out, n, eps, rows, xq=None, xs=None, config=None)
    add_rmsnorm(g, x, delta, w, out, n, eps, rows, w_post=None, eps_post=eps, xq=None, xs=None, config=None)
        x += (rmsnorm(delta) * w_post if w_post else delta); out = rmsnorm(x) * w
    xq/xs (int8 [rows, n] / memra.gpu.q8.Q8_SCALE [rows, n/32]): also write out's q8
    twin for the dp4a matvecs, bit-identical to memra.gpu.ops.matvec.quantize_q8 of out.

References: `reference_rmsnorm`, `reference_add_rmsnorm` (float32 numpy, the formula of
memra.cpu.reference.rms_norm). Tolerance 1e-5 relative (the reductions are ordered differently).
"""

from __future__ import annotations

from typing import Iterator

import numpy as np

from memra.errors import MemraError
from memra.gpu.ops import launch_bucket, pdl_trigger_define

KERNEL_FILE = "norm.cu"
TOL = 1e-5

_NULL = np.uint64(0)


def threads_for(n: int, split: bool = False) -> int:
    """Block size for rows of n: one float4 per thread (the kernel is latency-bound: one
    block per row), between 64 and 1024 threads; with split (rmsnorm, n % 1024 == 0), 256
    threads holding n/1024 float4s each, one block per float4 column (see split_for). A
    row's reduction order depends on this and n only, so it is the same at any batch."""
    if split and split_for(n) > 1:
        return 256
    return int(min(1024, max(64, -(-(n // 4) // 32) * 32)))


def split_for(n: int) -> int:
    """Blocks per row of rmsnorm: n / 1024 for n % 1024 == 0 (a 1024-thread block needs a
    whole SM's registers, so it waits for one to drain), else 1."""
    return n // 1024 if n % 1024 == 0 and n >= 2048 else 1


MAXV = 8  # at most this many float4s a thread holds (NORM_MAXV): rows up to 32 * 1024


def maxv_for(n: int, split: bool = False) -> int:
    """float4s each thread holds for rows of n (the row lives in registers)."""
    return -(-(n // 4) // threads_for(n, split))


def _check_n(n: int) -> None:
    if maxv_for(n) > MAXV:
        raise MemraError(f"norm kernels take rows of at most {4 * MAXV * 1024} values, got {n}")


def launch_config(n: int, split: bool = False, config: dict | None = None) -> tuple[int, int, int]:
    """(NORM_THREADS, NORM_MAXV, blocks per row) for rows of n. Default: threads_for /
    maxv_for / split_for (split only with `split`, i.e. rmsnorm). config {"NORM_THREADS": T}
    (a tuning table's choice) sets the block size; NORM_MAXV = ceil(n / 4 / T) follows, and
    rmsnorm splits a row over NORM_MAXV blocks only when they tile it exactly
    (T * NORM_MAXV * 4 == n). A row's bits depend on T (the reduction order), never on the
    split: each block reduces the whole row."""
    if not config or "NORM_THREADS" not in config:
        _check_n(n)
        return threads_for(n, split), maxv_for(n, split), split_for(n) if split else 1
    t = int(config["NORM_THREADS"])
    if t < 32 or t > 1024 or t % 32:
        raise MemraError(f"norm: NORM_THREADS must be a multiple of 32 in 32..1024, got {t}")
    maxv = -(-(n // 4) // t)
    if maxv > MAXV:
        raise MemraError(f"norm: NORM_THREADS={t} leaves {maxv} float4s a thread for rows of {n} (at most {MAXV})")
    blocks = maxv if split and maxv > 1 and t * maxv * 4 == n else 1
    return t, maxv, blocks


def _defines(threads: int, maxv: int, canary: bool = False, config: dict | None = None) -> dict:
    """A norm module's -D defines: what every launch, check and tune hook of it names; NORM_PDL_TRIGGER (norm.cu: 0
    never, 1 after the PDL wait, 2 before it) where a table entry's configuration names it."""
    return {"NORM_THREADS": threads, "NORM_MAXV": maxv, **({"MEMRA_CANARY": 1} if canary else {}),
            **pdl_trigger_define(config, "NORM_PDL_TRIGGER", "norm")}


def _module(g, threads: int, maxv: int, canary: bool = False, config: dict | None = None):
    return g.module(KERNEL_FILE, _defines(threads, maxv, canary, config))


def _check_f32(*arrays) -> None:
    for a in arrays:
        if a is not None and a.dtype != np.float32:
            raise MemraError(f"norm kernels take float32 arrays, got {a.dtype}")


def _q8_args(xq, xs, n: int, rows: int):
    if xq is None:
        return _NULL, _NULL
    if n % 32 or xq.dtype != np.int8 or xq.size < rows * n or xs.size < rows * n // 32:
        raise MemraError(f"norm q8 output: n % 32 == 0 and int8 xq [rows, n], xs [rows, n/32] (n={n})")
    return xq, xs


def rmsnorm(g, x, w, out, n: int, eps: float, rows: int = 1, xq=None, xs=None, pdl: bool = False,
            canary: bool = False, config: dict | None = None) -> None:
    """config: {"NORM_THREADS": T} (see launch_config; default the built-in rule), NORM_PDL_TRIGGER (_defines)."""
    _check_f32(x, w, out)
    if n % 4 or x.size < rows * n or out.size < rows * n or w.size != n:
        raise MemraError(f"rmsnorm: bad sizes (n={n}, rows={rows}, x={x.size}, out={out.size}, w={w.size})")
    t, maxv, blocks = launch_config(n, True, config)
    k = _module(g, t, maxv, canary, config).kernel("rmsnorm")
    g.launch(k, (rows, blocks), (t,), (x, w, out, np.int32(n), np.float32(eps), *_q8_args(xq, xs, n, rows)),
             pdl=pdl)


def add_rmsnorm(g, x, delta, w, out, n: int, eps: float, rows: int = 1, w_post=None,
                eps_post: float | None = None, xq=None, xs=None, pdl: bool = False,
                canary: bool = False, config: dict | None = None) -> None:
    """config: {"NORM_THREADS": T} (see launch_config; default the built-in rule), NORM_PDL_TRIGGER (_defines)."""
    _check_f32(x, delta, w, out, w_post)
    if n % 4 or min(x.size, delta.size, out.size) < rows * n or w.size != n:
        raise MemraError(f"add_rmsnorm: bad sizes (n={n}, rows={rows})")
    t, maxv, _ = launch_config(n, False, config)
    k = _module(g, t, maxv, canary, config).kernel("add_rmsnorm")
    g.launch(k, (rows,), (t,),
             (x, delta, w_post if w_post is not None else _NULL, w, out, np.int32(n),
              np.float32(eps if eps_post is None else eps_post), np.float32(eps), *_q8_args(xq, xs, n, rows)),
             pdl=pdl)


def reference_rmsnorm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    from memra.cpu.reference import rms_norm

    return rms_norm(np.asarray(x, np.float32), np.asarray(w, np.float32), eps)


def reference_add_rmsnorm(x, delta, w, eps, w_post=None, eps_post=None):
    """(new x, out) of add_rmsnorm."""
    from memra.cpu.reference import rms_norm

    d = np.asarray(delta, np.float32)
    if w_post is not None:
        d = rms_norm(d, np.asarray(w_post, np.float32), eps if eps_post is None else eps_post)
    xn = np.asarray(x, np.float32) + d
    return xn, rms_norm(xn, np.asarray(w, np.float32), eps)


# -- kernel-check ------------------------------------------------------------------------

_CHECK_N = (128, 576, 640, 2048, 4096, 6000, 8192)


def compile_variants():
    return [(KERNEL_FILE, _defines(t, v))
            for t, v in sorted({(threads_for(n, sp), maxv_for(n, sp)) for n in _CHECK_N for sp in (False, True)})] + \
           [(KERNEL_FILE, _defines(threads_for(640), maxv_for(640), canary=True))]


def _inputs(rng, rows, n):
    x = (rng.standard_normal((rows, n)) * rng.uniform(0.1, 10)).astype(np.float32)
    w = rng.uniform(0.5, 1.5, n).astype(np.float32)
    return x, w


def _check_rmsnorm(g, rng, rows, n, canary=False):
    from memra.gpu.compare import compare

    x, w = _inputs(rng, rows, n)
    eps = 1e-6
    dx, dw = g.to_device(x), g.to_device(w)
    out = g.empty((rows, n), np.float32)
    out.poison()
    rmsnorm(g, dx, dw, out, n, eps, rows, canary=canary)
    return compare(f"rmsnorm rows={rows} n={n}", out.numpy(), reference_rmsnorm(x, w, eps), TOL)


def _check_add(g, rng, rows, n, post: bool):
    from memra.gpu.compare import compare

    x, w = _inputs(rng, rows, n)
    delta = (rng.standard_normal((rows, n)) * 3).astype(np.float32)
    wp = rng.uniform(0.5, 1.5, n).astype(np.float32) if post else None
    eps, eps_post = 1e-5, 1e-6
    dx, dd, dw = g.to_device(x), g.to_device(delta), g.to_device(w)
    dwp = g.to_device(wp) if post else None
    out = g.empty((rows, n), np.float32)
    out.poison()
    add_rmsnorm(g, dx, dd, dw, out, n, eps, rows, w_post=dwp, eps_post=eps_post)
    xr, outr = reference_add_rmsnorm(x, delta, w, eps, wp, eps_post)
    name = f"add_rmsnorm{' post' if post else ''} rows={rows} n={n}"
    o1 = compare(name + " out", out.numpy(), outr, TOL)
    o2 = compare(name + " residual", dx.numpy(), xr, TOL)
    return o1 if not o1.ok else o2 if not o2.ok else type(o1)(name, True, f"{o1.detail}; {o2.detail}")


def _check_q8(g, rng, rows, n, add: bool):
    """The fused q8 twin equals quantize_q8 (the shared rule) of the kernel's own output."""
    from memra.gpu.compare import Outcome, compare
    from memra.gpu.q8 import Q8_SCALE, q8_twin_matches

    x, w = _inputs(rng, rows, n)
    dx, dw = g.to_device(x), g.to_device(w)
    out = g.empty((rows, n), np.float32)
    xq, xs = g.empty((rows, n), np.int8), g.empty((rows, n // 32), Q8_SCALE)
    for a in (out, xq, xs):
        a.poison()
    if add:
        delta = rng.standard_normal((rows, n)).astype(np.float32)
        add_rmsnorm(g, dx, g.to_device(delta), dw, out, n, 1e-6, rows, xq=xq, xs=xs)
        ref = reference_add_rmsnorm(x, delta, w, 1e-6)[1]
    else:
        rmsnorm(g, dx, dw, out, n, 1e-6, rows, xq=xq, xs=xs)
        ref = reference_rmsnorm(x, w, 1e-6)
    o = out.numpy()
    name = f"{'add_' if add else ''}rmsnorm+q8 rows={rows} n={n}"
    c1 = compare(name + " out", o, ref, TOL)
    ok = q8_twin_matches(xq, xs, o)
    if not c1.ok:
        return c1
    return Outcome(name, ok, f"{c1.detail}; q8 twin {'bit-exact' if ok else 'DIFFERS from quantize_q8'}")


def checks(g, rng: np.random.Generator) -> Iterator:
    for rows, n in ((1, 576), (3, 640), (2, 4096), (1, 128), (2, 8192), (1, 6000)):
        yield _check_rmsnorm(g, rng, rows, n)
    yield _check_q8(g, rng, 2, 576, add=False)
    yield _check_q8(g, rng, 3, 2048, add=True)
    yield _check_q8(g, rng, 2, 8192, add=False)
    yield _check_q8(g, rng, 1, 4096, add=True)
    for rows, n in ((1, 576), (4, 2048)):
        yield _check_add(g, rng, rows, n, post=False)
        yield _check_add(g, rng, rows, n, post=True)


def canaries(g, rng: np.random.Generator) -> Iterator:
    yield _check_rmsnorm(g, rng, 2, 640, canary=True)


# -- the launch set (memra.tune.launches) ---------------------------------------------------

def launch_cases(L, ctx) -> list[dict]:
    """A plan launch of op "norm" (rmsnorm) or "add_norm" (add_rmsnorm): the module the
    launcher builds for this row length and the table's NORM_THREADS, with the runner's q8
    twin on the q8 path and the post-norm weight where the plan passes one."""
    n = int(L.shape["n"])
    add = L.op == "add_norm"
    t, maxv, blocks = launch_config(n, not add, L.config)
    post, q8 = add and bool(L.args.get("w_post")), ctx.path == "q8"
    b = launch_bucket(L.rows)
    return [{"file": KERNEL_FILE, "entry": "add_rmsnorm" if add else "rmsnorm",
             "defines": _defines(t, maxv, config=L.config), "bucket": b,
             "tag": f"n{n}" + (" post" if post else "") + (" q8" if q8 else ""),
             "params": {"n": n, "rows": b, "add": add, "post": post, "q8": q8,
                        "config": dict(L.config) if L.config else None}}]


def check_launch(g, rng, case):
    """The case's launch on fresh rows: out (and add_rmsnorm's residual update) against the
    reference, the q8 twin bit-exact against quantize_q8 of the kernel's own output."""
    from memra.gpu.compare import Outcome, compare
    from memra.gpu.q8 import Q8_SCALE, q8_twin_matches

    p = case["params"]
    n, rows, add, post, q8, config = p["n"], p["rows"], p["add"], p["post"], p["q8"], p["config"]
    x, w = _inputs(rng, rows, n)
    dx, dw = g.to_device(x), g.to_device(w)
    out = g.empty((rows, n), np.float32)
    xq = g.empty((rows, n), np.int8) if q8 else None
    xs = g.empty((rows, n // 32), Q8_SCALE) if q8 else None
    for a in (out, xq, xs):
        if a is not None:
            a.poison()
    eps, eps_post = 1e-6, 1e-5
    if add:
        delta = (rng.standard_normal((rows, n)) * 3).astype(np.float32)
        wp = rng.uniform(0.5, 1.5, n).astype(np.float32) if post else None
        add_rmsnorm(g, dx, g.to_device(delta), dw, out, n, eps, rows, w_post=g.to_device(wp) if post else None,
                    eps_post=eps_post, xq=xq, xs=xs, config=config)
        xr, ref = reference_add_rmsnorm(x, delta, w, eps, wp, eps_post)
    else:
        rmsnorm(g, dx, dw, out, n, eps, rows, xq=xq, xs=xs, config=config)
        ref = reference_rmsnorm(x, w, eps)
    g.sync()
    name = f"{case['entry']} rows={rows} n={n} {case['defines']}{' post' if post else ''}{' +q8' if q8 else ''}"
    o = out.numpy()
    c = compare(name, o, ref, TOL)
    if not c.ok:
        return c
    if add:
        r = compare(name + " residual", dx.numpy(), xr, TOL)
        if not r.ok:
            return r
    if q8 and not q8_twin_matches(xq, xs, o):
        return Outcome(name, False, "q8 twin differs from quantize_q8 of the output", c.err)
    return Outcome(name, True, c.detail + ("; q8 twin bit-exact" if q8 else ""), c.err)


# -- tune hook (memra/tune/measure.py): kernels "rmsnorm" / "add_rmsnorm", variant "default",
# shape {n: n_embd}, batch rows; config {"NORM_THREADS": T}

def tune_modules(kernel: str, variant: str, config: dict, shape: dict) -> list[tuple[str, dict]]:
    """(kernel file, defines) of the module a norm tune job (or a table entry) loads, as tune_case launches it:
    `memra tune run` precompiles it, and `memra tune carry` compiles it from two trees to prove a norm.cu edit left
    it the same code."""
    t, maxv, _ = launch_config(int(shape["n"]), kernel == "rmsnorm", config)
    return [(KERNEL_FILE, _defines(t, maxv, config=config))]


# the kernels tune_case measures and their variants (memra tune run checks a campaign's names against them)
TUNE_VARIANTS = {"rmsnorm": ("default",), "add_rmsnorm": ("default",)}


def tune_case(g, kernel: str, variant: str, config: dict, shape: dict, rng, rotate_bytes: int):
    if variant not in TUNE_VARIANTS.get(kernel, ()):
        raise MemraError(f"norm tune: unknown kernel/variant {kernel}/{variant}")
    return _TuneCase(g, kernel == "add_rmsnorm", dict(config or {}), int(shape["n"]), int(shape.get("batch", 1)),
                     rng, rotate_bytes)


class _TuneCase:
    """As the engine launches them: rmsnorm of x into h, add_rmsnorm (gemma3's post-norms,
    the only place the engine uses it) with w_post, x updated in place; both with h's q8
    twin (the q8 path) when n % 32 == 0. `sets` copies of x (and delta) and the outputs."""

    def __init__(self, g, add, config, n, rows, rng, rotate_bytes):
        self.g, self.add, self.config, self.n, self.rows, self.rng = g, add, config, n, rows, rng
        if n % 4:
            raise MemraError(f"norm tune: rows of n % 4 == 0 only, got {n}")
        launch_config(n, not add, config)  # a bad value fails here: a failed receipt
        self.q8 = n % 32 == 0
        from memra.gpu.q8 import Q8_SCALE

        f = rows * n * 4
        q8b = rows * n + rows * n // 32 * Q8_SCALE.itemsize if self.q8 else 0
        ins = 2 if add else 1  # x (and delta)
        self.bytes = (ins * f + n * 4 * (2 if add else 1)) + (f if add else 0) + f + q8b
        per = ins * f + f + q8b
        self.sets = max(1, -(-rotate_bytes // per))
        x, w = _inputs(rng, rows, n)
        self.w = g.to_device(w)
        self.wp = g.to_device(rng.uniform(0.5, 1.5, n).astype(np.float32)) if add else None
        host = np.concatenate([x.reshape(-1)] + ([(rng.standard_normal(rows * n) * 3).astype(np.float32)] if add else []))
        self.inp = g.to_device(np.tile(host, self.sets))
        self.out = g.empty(self.sets * rows * n, np.float32)
        self.xq = g.empty(self.sets * rows * n, np.int8) if self.q8 else None
        self.xs = g.empty(self.sets * rows * n // 32, Q8_SCALE) if self.q8 else None

    def _run(self, x, delta, out, xq, xs):
        if self.add:
            add_rmsnorm(self.g, x, delta, self.w, out, self.n, 1e-6, self.rows, w_post=self.wp, eps_post=1e-6,
                        xq=xq, xs=xs, config=self.config)
        else:
            rmsnorm(self.g, x, self.w, out, self.n, 1e-6, self.rows, xq=xq, xs=xs, config=self.config)

    def launch(self, i: int) -> None:
        rn = self.rows * self.n
        ins = 2 if self.add else 1
        x = self.inp.view(np.float32, (rn,), 4 * ins * rn * i)
        delta = self.inp.view(np.float32, (rn,), 4 * (ins * rn * i + rn)) if self.add else None
        q = (self.xq.view(np.int8, (rn,), rn * i), self.xs.view(None, (rn // 32,), (rn // 32) * i * self.xs.dtype.itemsize)) \
            if self.q8 else (None, None)
        self._run(x, delta, self.out.view(np.float32, (rn,), 4 * rn * i), *q)

    def check(self):
        from memra.gpu.compare import compare
        from memra.gpu.q8 import Q8_SCALE, q8_twin_matches

        g, rows, n = self.g, self.rows, self.n
        x, _ = _inputs(self.rng, rows, n)
        w, wp = self.w.numpy(), (self.wp.numpy() if self.add else None)
        delta = (self.rng.standard_normal((rows, n)) * 3).astype(np.float32)
        dx, dd = g.to_device(x), g.to_device(delta)
        out = g.empty((rows, n), np.float32)
        xq = g.empty((rows, n), np.int8) if self.q8 else None
        xs = g.empty((rows, n // 32), Q8_SCALE) if self.q8 else None
        for a in (out, xq, xs):
            if a is not None:
                a.poison()
        self._run(dx, dd, out, xq, xs)
        g.sync()
        if self.add:
            xr, ref = reference_add_rmsnorm(x, delta, w, 1e-6, wp, 1e-6)
        else:
            ref = reference_rmsnorm(x, w, 1e-6)
        o = out.numpy()
        c = compare(f"{'add_' if self.add else ''}rmsnorm rows={rows} n={n}", o, ref, TOL)
        err = c.err
        if not c.ok:
            return False, err, c.detail
        if self.add:
            r = compare("residual", dx.numpy(), xr, TOL)
            if not r.ok:
                return False, max(err, r.err), r.detail
            err = max(err, r.err)
        if self.q8 and not q8_twin_matches(xq, xs, o):
            return False, err, "q8 twin differs from quantize_q8 of the output"
        return True, err, c.detail

