"""A skinny tensor-core matvec for 2..15 rows (kernels/mvt.cu; the plan runs it from MVT_MIN_ROWS = 3), bit-identical to the matvec
(kernels/matvec.cu's mv_q8 / mv_q8_glu) for every row.

    mvt(g, w, y, xq=xq, xs=xs, nb=nb)                  # y[b, :] = W x[b, :], b < nb
        residual=r   y = r + W x (r may be y itself)
        glu="silu"|"gelu"   W holds [gate; up] (2N rows): y = act(gate x) * (up x)

`w` is a memra.gpu.ops.matvec.Weight (the planes layout), xq/xs the q8 activations. A warp owns
one m16 tile of weight rows and MVT_TN n8 tiles of batch columns, loads the weights straight
from global memory into mma.sync A fragments (gemm.cu's fragment code, kernels/mma_frag.cuh),
and walks its slots in the matvec's butterfly order (mvt.cu's header gives the argument), so
the runner may send any batch to it, the matvec or the GEMM. The plan takes it at 2 rows up to
GEMM_MIN_ROWS - 1 on the q8 path (MEMRA_MVT=0 rolls back to 8-row mv_q8 chunks): on the H200
(research/2026-12-01-mvt/) 1.5-2.6x faster than mv_q8 at 8 rows and 1.0-1.3x than the GEMM's
small-batch config at 16. Any nb >= 1 works (grid.y = ceil(nb / (8 MVT_TN))).

Launch contract (mvt.cu): grid (ceil(N / (OBM MVT_WM)), ceil(nb / (8 MVT_TN))) with OBM 16
(mvt_q8) or 8 (mvt_q8_glu), block 32 MVT_WM MVT_WK, no dynamic shared memory (static
(WK - 1) WM 32 TN 4 floats for the final merge). Tunables (-D): MVT_TN, MVT_WK, MVT_WM,
MVT_PREFETCH, MVT_WLOAD, MVT_MINB, MVT_KPERM (MVT_JFIX and MVT_PIN stay at the kernel's 1);
built-in configurations per batch bucket below, a tuning table's MVT_* laid over them.

The checks compare mvt's bits with the matvec's (the oracle of the exactness contract) and
both with the float64 reference (memra.gpu.ops.matvec.matvec_ref) at the matvec's TOL.
"""

from __future__ import annotations

import sys
from typing import Iterator

import numpy as np

from memra.errors import MemraError
from memra.gpu.ops import gemm as GEMM
from memra.gpu.ops import matvec as MV
from memra.gpu.q8 import Q8_SCALE

KERNEL_FILE = "mvt.cu"
# the plan runs mvt from this many rows up to GEMM.GEMM_MIN_ROWS - 1 (fewer: mv_q8). On the
# H200 (8B Q4_K_M tg128, research/2026-12-01-gemm-v7/) mvt's step costs about the same at 2
# to 8 rows (bound by its per-output work, not the weight bytes): 2 rows 448.8 t/s against
# mv_q8's 595.9, 3 rows 660.3 against 557.6, 4 rows 878.9 against 743.9
MVT_MIN_ROWS = 3
TYPES = GEMM.TYPES  # the quantized types (mma_frag.cuh's)
_KEYS = ("MVT_TN", "MVT_WK", "MVT_WM", "MVT_PREFETCH", "MVT_WLOAD", "MVT_MINB", "MVT_KPERM")
_NULL = np.uint64(0)


def _cfg(text: str) -> dict:
    return dict(zip(_KEYS, (int(v) for v in text.split(","))))


# The H200's best exact configurations (experiments/mvt/mvt_check.py --nbs 8,16, 7 shapes of the
# 8B, research/2026-12-01-mvt/): one n tile per warp up to 8 rows, two from 9; 8 warps split a
# tile's slots; KPERM 1 (8-byte lane loads; Q4_K / Q5_K / Q8_0 only, ignored by the others) won
# at Q4_K 4096x4096, Q4_K glu and Q8_0. The Q6_K head wanted WK 4 / MINB 4 (a table entry's
# business); the 8-row bucket was measured at 8 rows only (2..7 run the same module).
CONFIGS = ((8, _cfg("1,8,1,2,0,2,1")), (1 << 30, _cfg("2,8,1,2,0,2,1")))
# the device check's other configurations (experiments/mvt/mvt_check.py's check_cfgs): the
# widest slot split with everything switched, and 4 tiles a block without a slot split
_CHECK_CONFIGS = (_cfg("1,16,1,3,1,1,1"), _cfg("2,1,4,0,0,1,0"))


def default_config(nb: int) -> dict:
    for top, cfg in CONFIGS:
        if nb <= top:
            return dict(cfg)
    raise AssertionError("unreachable")


def launch_config(nb: int, config: dict | None = None) -> dict:
    """The MVT_* tunables of a launch over nb rows: default_config(nb) with `config`'s MVT_*
    (a tuning table's entry, a tune job's, kernel-check's) laid over it."""
    return {**default_config(nb), **{k: int(v) for k, v in (config or {}).items() if k.startswith("MVT_")}}


def launch_shape(config: dict, N: int, nb: int, glu: bool):
    """(grid, block, dynamic shared bytes) of a launch (mvt.cu's launch contract)."""
    c = config
    tn, wk, wm, minb = c["MVT_TN"], c["MVT_WK"], c["MVT_WM"], c["MVT_MINB"]
    nthr = 32 * wm * wk
    if wk not in (1, 2, 4, 8, 16) or tn not in (1, 2) or not 0 <= c["MVT_PREFETCH"] <= 3 or \
            c["MVT_WLOAD"] not in (0, 1) or c["MVT_KPERM"] not in (0, 1) or wm < 1 or minb < 1 or \
            nthr > 1024 or nthr * minb > 2048:
        raise MemraError(f"mvt: bad configuration {c} (MVT_WK a power of two <= 16, MVT_TN 1 or 2, "
                         f"MVT_PREFETCH 0..3, MVT_WLOAD / MVT_KPERM 0 or 1, at most 1024 threads = 32 * "
                         f"MVT_WM * MVT_WK and 2048 per SM with MVT_MINB blocks)")
    obm = (8 if glu else 16) * wm
    return ((N + obm - 1) // obm, (nb + 8 * tn - 1) // (8 * tn)), (nthr,), 0


def _defines(ggml_type: int, config: dict, canary: int = 0) -> dict:
    d = {"MV_TYPE": ggml_type, **config}
    if canary:
        d["MEMRA_CANARY"] = canary
    return d


def mvt(g, w, y, *, xq, xs, nb: int, residual=None, glu: str | None = None, config: dict | None = None,
        canary: int = 0, pdl: bool = False) -> None:
    """y[b, :] (+)= W x[b, :] for b < nb on the q8 activations xq/xs. config: MVT_* tunables laid
    over default_config(nb) (a tuning table's entry, or kernel-check's)."""
    t = w.ggml_type
    if t not in TYPES:
        raise MemraError(f"mvt: no tensor-core kernel for {MV.TYPES[t][0]} weights (quantized types only)")
    if glu not in MV.ACTS:
        raise MemraError(f"mvt: glu must be None, 'silu' or 'gelu' (got {glu!r})")
    if glu and w.rows % 2:
        raise MemraError("mvt: a GLU weight stacks gate and up (an even row count)")
    N = w.rows // 2 if glu else w.rows
    K = w.K
    if nb < 1:
        raise MemraError(f"mvt: nb must be >= 1 (got {nb})")
    if K % 64:
        raise MemraError(f"mvt: K = {K} is not a multiple of 64 (the kernel's unit)")
    if xq.dtype != np.int8 or xs.dtype != Q8_SCALE or xq.size < nb * K or xs.size < nb * K // 32:
        raise MemraError("mvt: xq/xs must be int8 / Q8_SCALE with nb rows of K")
    if y.dtype != np.float32 or y.size < nb * N or (residual is not None and
                                                    (residual.dtype != np.float32 or residual.size < nb * N)):
        raise MemraError(f"mvt: y (and residual) must be f32 with >= {nb}x{N} values")
    cfg = launch_config(nb, config)
    grid, block, smem = launch_shape(cfg, N, nb, bool(glu))
    k = g.module(KERNEL_FILE, _defines(t, cfg, canary)).kernel("mvt_q8_glu" if glu else "mvt_q8")
    g.launch(k, grid, block, (w.bulk, w.meta, xq, xs, y, residual if residual is not None else _NULL,
                              np.int32(N), np.int32(K), np.int32(nb), np.int32(MV.ACTS[glu])), shmem=smem, pdl=pdl)


# -- kernel-check -----------------------------------------------------------------------

_CHECK_NB = (2, 5, 8, 9, 15)  # both built-in buckets, partial n tiles, one and two tiles
_CHECK_N, _CHECK_K = 200, 2560  # nu = 40 units a row: uneven slots; 200 rows: a partial last tile


def compile_variants() -> list[tuple[str, dict]]:
    out = []
    for t in TYPES:
        for cfg in [c for _, c in CONFIGS] + list(_CHECK_CONFIGS):
            out.append((KERNEL_FILE, _defines(t, cfg)))
    out.append((KERNEL_FILE, _defines(12, default_config(8), canary=1)))
    return out


def _case(g, rng, t: int, nb: int, glu: str | None, alias: bool, config=None, canary: int = 0, N=_CHECK_N,
          K=_CHECK_K):
    """A fresh random weight of type t, N x K, mvt against the matvec's bits and the float64
    reference (memra.gpu.ops.gemm's check)."""
    return GEMM.check_case(g, rng, t, nb, glu, alias, config, canary, N, K, launch=mvt, label="mvt")


def checks(g, rng: np.random.Generator) -> Iterator:
    for t in TYPES:
        for i, nb in enumerate(_CHECK_NB):
            glu = (None, "silu", "gelu", None, "silu")[i]
            yield _case(g, rng, t, nb, glu, alias=glu is None and nb == 9)
        # the device check's other configurations: plain at 8 rows, glu at 15
        for cfg, nb, glu in zip(_CHECK_CONFIGS, (8, 15), (None, "silu")):
            yield _case(g, rng, t, nb, glu, alias=False, config=cfg)
    # the K-quant and Q6_K shapes of an 8B layer's matvecs at decode batches
    for t, N, K, glu in ((12, 512, 4096, "silu"), (14, 256, 14336, None)):
        for nb in (4, 12):
            yield _case(g, rng, t, nb, glu, alias=glu is None, N=N, K=K)


def canaries(g, rng: np.random.Generator) -> Iterator:
    yield _case(g, rng, 12, 8, None, alias=False, canary=1)


# -- the tune hooks (kernel "mvt" | "mvt_glu", config MVT_*) and the launch-set hooks (op
# "mvt": the q8 path at MVT_MIN_ROWS..GEMM_MIN_ROWS - 1 rows): gemm's (memra.gpu.ops.gemm.Hooks)
# on this family's launcher and configuration functions

HOOKS = GEMM.Hooks("mvt", sys.modules[__name__], KERNEL_FILE, _KEYS, launch_config, default_config,
                   lambda t, cfg, N, nb, glu: launch_shape(cfg, N, nb, glu), _defines)
tune_case, is_builtin, tune_modules = HOOKS.tune_case, HOOKS.is_builtin, HOOKS.tune_modules
launch_cases, check_launch = HOOKS.launch_cases, HOOKS.check_launch
