"""Quantized products on the tensor cores in the chain order (kernels/gemm_tile.cu): every output one
float32 chain over the k32 blocks in increasing k (memra.gpu.chain gives the operations), so a row's
bits do not depend on the batch, the tile or the configuration.

    gemm_tile(g, w, y, xq=xq, xs=xs, nb=nb)            # y[b, :] = W x[b, :], b < nb
        residual=r   y = fl(W x + r) (r may be y itself)
        glu="silu"|"gelu"   W holds [gate; up] (2N rows): y = fl(act(gate x) * (up x))

Weight types: Q4_0, Q8_0, Q4_K, Q6_K (memra.gpu.chain.TYPES), in memra.gpu.ops.matvec's planes
layout. Tunables (-D): GT_WM, GT_WN, GT_STAGES, GT_PF, GT_MINB; per type the configuration the H200
measured fastest at 512 rows (research/2026-12-02-session16, ab/) unless a table entry says otherwise.

The oracle (kernel-check, the tune hook): plain outputs bit for bit memra.gpu.chain.chain on the
same q8 activations (and the float64 product at matvec's TOL); with a residual, fl(chain + r); glu
outputs bit for bit act_mul (kernels/act.cu, the engine's own activation) of the plain kernel's
gate and up outputs, which are themselves checked against the chain.

Experiment stage: this file becomes memra/gpu/ops/gemm_tile.py when kernels/gemm_tile.cu lands
(experiments/tile_land/README.md).
"""

from __future__ import annotations

from typing import Iterator

import numpy as np

from memra.errors import MemraError
from memra.gpu import chain as CH
from memra.gpu.ops import matvec as MV
from memra.gpu.q8 import Q8_SCALE, quantize_q8_ref

KERNEL_FILE = "gemm_tile.cu"
TYPES = CH.TYPES
KEYS = ("GT_WM", "GT_WN", "GT_STAGES", "GT_PF", "GT_MINB")
_NULL = np.uint64(0)
_ACT = {None: 0, "silu": 1, "gelu": 2}   # gemm.cu's act argument: 1 SiLU, 2 GELU-tanh
_ACT_MUL = {"silu": "silu", "gelu": "gelu_tanh"}


def _launch_module():
    """launch_shape / default_config of the kernel (experiments/tile_land/launch.py until landing)."""
    import importlib.util
    from pathlib import Path

    p = Path(__file__).with_name("launch.py")
    spec = importlib.util.spec_from_file_location("tile_launch", p)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


_L = _launch_module()


# up to this many rows the 2 x 2-warp tile with 3 stages (64 activation columns a block) is the
# built-in: at 64 rows it ran the Q4_K gate + up in 156.0 µs against 371.1 for the 2 x 4 tile, Q6_K
# 4096 x 14336 in 308.2 against 504.8, Q8_0 6144 x 4096 in 65.2 against 147.8; at 128 rows the 2 x 4
# tile wins (Q4_K gate + up 216.7 against 304.1; research/2026-12-02-session16/ab/)
SMALL_ROWS = 64
_SMALL = {"GT_WM": 2, "GT_WN": 2, "GT_STAGES": 3}


def default_config(t: int, nb: int = 512) -> dict:
    """The built-in tunables of a launch over nb rows (a table entry per row bucket overrides them).
    The chain does not depend on the configuration, so it may change with the row count."""
    c = dict(_L.default_config(t))
    return {**c, **_SMALL} if nb <= SMALL_ROWS else c


def launch_config(t: int, nb: int = 512, config: dict | None = None) -> dict:
    """default_config(t, nb) with `config`'s GT_* (a table entry, a tune job's, kernel-check's) over it."""
    return {**default_config(t, nb), **{k: int(v) for k, v in (config or {}).items() if k.startswith("GT_")}}


def launch_shape(t: int, config: dict, N: int, nb: int, glu: bool):
    try:
        return _L.launch_shape(t, config, N, nb, glu)
    except ValueError as e:
        raise MemraError(str(e)) from None


def check_shape(t: int, config: dict, N: int, K: int, nb: int, glu: bool) -> None:
    """The host contract (kernels/gemm_tile.cu's header): the types, N a multiple of the output
    tile (no partial row tile), K of the type's K step (256; Q6_K 512), 32-bit offsets."""
    if t not in TYPES:
        raise MemraError(f"gemm_tile: no tile kernel for {MV.TYPES[t][0]} weights "
                         f"(it has {', '.join(MV.TYPES[v][0] for v in TYPES)})")
    try:
        _L.check(t, config, N, K, nb, glu)
    except ValueError as e:
        raise MemraError(str(e)) from None


def _defines(t: int, config: dict, canary: int = 0) -> dict:
    d = {"MV_TYPE": t, **config}
    if canary:
        d["MEMRA_CANARY"] = canary
    return d


def gemm_tile(g, w, y, *, xq, xs, nb: int, residual=None, glu: str | None = None, config: dict | None = None,
              canary: int = 0, pdl: bool = False) -> None:
    """y[b, :] (+)= W x[b, :] for b < nb on the q8 activations xq / xs, every output the chain."""
    t = w.ggml_type
    if glu not in _ACT:
        raise MemraError(f"gemm_tile: glu must be None, 'silu' or 'gelu' (got {glu!r})")
    if glu and w.rows % 2:
        raise MemraError("gemm_tile: a GLU weight stacks gate and up (an even row count)")
    N, K = (w.rows // 2 if glu else w.rows), w.K
    cfg = launch_config(t, nb, config)
    check_shape(t, cfg, N, K, nb, bool(glu))
    if xq.dtype != np.int8 or xs.dtype != Q8_SCALE or xq.size < nb * K or xs.size < nb * K // 32:
        raise MemraError("gemm_tile: xq/xs must be int8 / Q8_SCALE with nb rows of K")
    if y.dtype != np.float32 or y.size < nb * N or (residual is not None and residual.size < nb * N):
        raise MemraError(f"gemm_tile: y (and residual) must be f32 with >= {nb}x{N} values")
    grid, block, smem = launch_shape(t, cfg, N, nb, bool(glu))
    k = g.module(KERNEL_FILE, _defines(t, cfg, canary)).kernel("gemm_tile_glu" if glu else "gemm_tile")
    g.launch(k, grid, block, (w.bulk, w.meta, xq, xs, y, residual if residual is not None else _NULL,
                              np.int32(N), np.int32(K), np.int32(nb), np.int32(_ACT[glu])), shmem=smem, pdl=pdl)


# -- kernel-check -----------------------------------------------------------------------

TOL = MV.TOL
# (nb, glu, residual aliasing y): one row, partial column tiles, a full 128-column tile
_CHECK = ((1, None, False), (9, None, False), (64, "silu", False), (130, None, True), (33, "gelu", False),
          (128, None, False))


def compile_variants() -> list[tuple[str, dict]]:
    out = [(KERNEL_FILE, _defines(t, launch_config(t, nb))) for t in TYPES for nb in (SMALL_ROWS, 512)]
    out.append((KERNEL_FILE, _defines(12, launch_config(12), canary=1)))
    return out


def against_chain(g, rng, name: str, t: int, raw: np.ndarray, nb: int, glu: str | None, alias: bool,
                  config=None, canary: int = 0):
    """The tile kernel on GGUF rows `raw` (2N rows for glu) against the chain's bits on the same
    q8 activations, and the float64 product at TOL. glu: the glu kernel against act_mul of the
    plain kernel's gate and up outputs (each checked against the chain first)."""
    from memra.gpu.compare import Outcome, compare
    from memra.gpu.ops import act as ACT

    w = MV.upload_weight(g, raw, t)
    rows, K = raw.shape[0], w.K
    N = rows // 2 if glu else rows
    x = (rng.standard_normal((nb, K)) * rng.uniform(0.5, 4)).astype(np.float32)
    xq, xs = g.empty((nb, K), np.int8), g.empty((nb, K // 32), Q8_SCALE)
    MV.quantize_q8(g, g.to_device(x), xq, xs, nb)
    q, s = quantize_q8_ref(x)
    want = CH.chain(raw, t, q, s["d"], s["s"])                       # [nb, rows]
    xv = (q.reshape(nb, -1, 32).astype(np.float64) * s["d"][..., None]).reshape(nb, K)
    wf = MV.dequant_rows(raw, t)
    # the plain kernel over every row (for glu: gate and up)
    yp = g.empty((nb, rows), np.float32)
    yp.poison()
    gemm_tile(g, w, yp, xq=xq, xs=xs, nb=nb, config=config, canary=canary)
    g.sync()
    got = yp.numpy()
    o = compare(name + " (plain)", got, MV.matvec_ref(wf, xv, None, None), TOL)
    if not o.ok:
        return o
    bad = int(np.count_nonzero(got.view(np.uint32) != want.view(np.uint32)))
    if bad:
        return Outcome(name, False, f"{bad} of {got.size} values differ from the chain's bits", o.err)
    if not glu and not alias:
        return Outcome(name, True, o.detail + "; = chain bit for bit", o.err)
    res = rng.standard_normal((nb, N)).astype(np.float32)
    if glu:   # the engine's activation on the checked plain outputs: the glu kernel's oracle
        ref_out = g.empty((nb, N), np.float32)
        ACT.act_mul(g, yp.view(np.float32, (nb * rows,), 0), yp.view(np.float32, (nb * rows - N,), 4 * N), ref_out,
                    N, nb, _ACT_MUL[glu], gate_stride=rows, up_stride=rows, out_stride=N)
        g.sync()
        want_out = ref_out.numpy()
    else:
        want_out = (want + res).astype(np.float32)
    y = g.to_device(res) if alias else g.empty((nb, N), np.float32)
    if not alias:
        y.poison()
    gemm_tile(g, w, y, xq=xq, xs=xs, nb=nb, residual=y if alias else None, glu=glu, config=config, canary=canary)
    g.sync()
    got = y.numpy()
    o = compare(name, got, MV.matvec_ref(wf, xv, res if alias else None, glu), TOL)
    if not o.ok:
        return o
    bad = int(np.count_nonzero(got.view(np.uint32) != want_out.view(np.uint32)))
    if bad:
        return Outcome(name, False, f"{bad} of {got.size} values differ from "
                                    f"{'act_mul of the plain outputs' if glu else 'fl(chain + residual)'}", o.err)
    return Outcome(name, True, o.detail + "; = chain bit for bit", o.err)


def check_case(g, rng, t: int, nb: int, glu: str | None, alias: bool, config=None, canary: int = 0,
               N: int = 256, K: int | None = None):
    K = K or 4 * _L.GEOM[t]["KMUL"]
    raw = MV.random_weight(t, 2 * N if glu else N, K, rng)
    name = (f"gemm_tile {MV.TYPES[t][0]} nb={nb} {N}x{K}{' glu-' + glu if glu else ''}{' +res(alias y)' if alias else ''}"
            f"{' ' + ','.join(f'{k}={v}' for k, v in config.items()) if config else ''}")
    return against_chain(g, rng, name, t, raw, nb, glu, alias, config, canary)


def checks(g, rng: np.random.Generator) -> Iterator:
    for t in TYPES:
        for nb, glu, alias in _CHECK:
            yield check_case(g, rng, t, nb, glu, alias)
    # an 8B layer's shapes at a prefill chunk and a decode batch (partial row and column tiles)
    for t, N, K, glu in ((12, 512, 4096, "silu"), (14, 256, 14336, None)):
        for nb in (16, 512):
            yield check_case(g, rng, t, nb, glu, alias=glu is None, N=N, K=K)


def canaries(g, rng: np.random.Generator) -> Iterator:
    yield check_case(g, rng, 12, 33, None, alias=False, canary=1)
