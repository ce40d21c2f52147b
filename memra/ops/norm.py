"""RMSNorm, alone and fused with the residual add (kernels/norm.cu).

    rmsnorm(g, x, w, out, n, eps, rows)
    add_rmsnorm(g, x, delta, w, out, n, eps, rows, w_post=None, eps_post=eps)
        x += (rmsnorm(delta) * w_post if w_post else delta); out = rmsnorm(x) * w

References: `reference_rmsnorm`, `reference_add_rmsnorm` (float32 numpy, the formula of
memra.reference.rms_norm). Tolerance 1e-5 relative (the reductions are ordered differently).
"""

from __future__ import annotations

from typing import Iterator

import numpy as np

from memra.errors import MemraError

KERNEL_FILE = "norm.cu"
THREADS = 256
TOL = 1e-5

_NULL = np.uint64(0)


def _module(g, canary: bool = False):
    d = {"NORM_THREADS": THREADS}
    if canary:
        d["MEMRA_CANARY"] = 1
    return g.module(KERNEL_FILE, d)


def _check_f32(*arrays) -> None:
    for a in arrays:
        if a is not None and a.dtype != np.float32:
            raise MemraError(f"norm kernels take float32 arrays, got {a.dtype}")


def rmsnorm(g, x, w, out, n: int, eps: float, rows: int = 1, canary: bool = False) -> None:
    _check_f32(x, w, out)
    if n % 4 or x.size < rows * n or out.size < rows * n or w.size != n:
        raise MemraError(f"rmsnorm: bad sizes (n={n}, rows={rows}, x={x.size}, out={out.size}, w={w.size})")
    k = _module(g, canary).kernel("rmsnorm")
    g.launch(k, (rows,), (THREADS,), (x, w, out, np.int32(n), np.float32(eps)))


def add_rmsnorm(g, x, delta, w, out, n: int, eps: float, rows: int = 1, w_post=None,
                eps_post: float | None = None, canary: bool = False) -> None:
    _check_f32(x, delta, w, out, w_post)
    if n % 4 or min(x.size, delta.size, out.size) < rows * n or w.size != n:
        raise MemraError(f"add_rmsnorm: bad sizes (n={n}, rows={rows})")
    k = _module(g, canary).kernel("add_rmsnorm")
    g.launch(k, (rows,), (THREADS,),
             (x, delta, w_post if w_post is not None else _NULL, w, out, np.int32(n),
              np.float32(eps if eps_post is None else eps_post), np.float32(eps)))


def reference_rmsnorm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    from memra.reference import rms_norm

    return rms_norm(np.asarray(x, np.float32), np.asarray(w, np.float32), eps)


def reference_add_rmsnorm(x, delta, w, eps, w_post=None, eps_post=None):
    """(new x, out) of add_rmsnorm."""
    from memra.reference import rms_norm

    d = np.asarray(delta, np.float32)
    if w_post is not None:
        d = rms_norm(d, np.asarray(w_post, np.float32), eps if eps_post is None else eps_post)
    xn = np.asarray(x, np.float32) + d
    return xn, rms_norm(xn, np.asarray(w, np.float32), eps)


# -- kernel-check ------------------------------------------------------------------------

def compile_variants():
    return [(KERNEL_FILE, {"NORM_THREADS": THREADS}),
            (KERNEL_FILE, {"NORM_THREADS": THREADS, "MEMRA_CANARY": 1})]


def _inputs(rng, rows, n):
    x = (rng.standard_normal((rows, n)) * rng.uniform(0.1, 10)).astype(np.float32)
    w = rng.uniform(0.5, 1.5, n).astype(np.float32)
    return x, w


def _check_rmsnorm(g, rng, rows, n, canary=False):
    from memra.kernelcheck import compare

    x, w = _inputs(rng, rows, n)
    eps = 1e-6
    dx, dw = g.to_device(x), g.to_device(w)
    out = g.empty((rows, n), np.float32)
    out.poison()
    rmsnorm(g, dx, dw, out, n, eps, rows, canary=canary)
    return compare(f"rmsnorm rows={rows} n={n}", out.numpy(), reference_rmsnorm(x, w, eps), TOL)


def _check_add(g, rng, rows, n, post: bool):
    from memra.kernelcheck import compare

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


def checks(g, rng: np.random.Generator) -> Iterator:
    for rows, n in ((1, 576), (3, 640), (2, 4096), (1, 128)):
        yield _check_rmsnorm(g, rng, rows, n)
    for rows, n in ((1, 576), (4, 2048)):
        yield _check_add(g, rng, rows, n, post=False)
        yield _check_add(g, rng, rows, n, post=True)


def canaries(g, rng: np.random.Generator) -> Iterator:
    yield _check_rmsnorm(g, rng, 2, 640, canary=True)
