"""A skinny tensor-core matvec for 2..15 rows (kernels/mvt.cu; the plan runs it from MVT_MIN_ROWS = 3), bit-identical to the matvec
(kernels/matvec.cu's mv_q8 / mv_q8_glu) for every row.

    mvt(g, w, y, xq=xq, xs=xs, nb=nb)                  # y[b, :] = W x[b, :], b < nb
        residual=r   y = r + W x (r may be y itself)
        glu="silu"|"gelu"   W holds [gate; up] (2N rows): y = act(gate x) * (up x)

`w` is a memra.gpu.ops.matvec.Weight (the planes layout), xq/xs the q8 activations. A warp owns
one m16 tile of weight rows and MVT_TN n8 tiles of batch columns and builds mma.sync A fragments
with gemm.cu's fragment code (kernels/mma_frag.cuh), in one of two layouts (MVT_LAYOUT): 0 (the
built-in) loads the weights straight from global memory into the fragments through a register
ring and walks its slots in the matvec's butterfly order; 1 (variant 6) stages the block's
weights, meta, activations and scales in shared memory by cp.async and folds each slot in K
order, adding the slots in the butterfly's order at the end (mvt.cu's header gives the argument
for both). Either way the runner may send any batch to it, the matvec or the GEMM. The plan takes it at 2 rows up to
GEMM_MIN_ROWS - 1 on the q8 path (MEMRA_MVT=0 rolls back to 8-row mv_q8 chunks): on the H200
(research/2026-12-01-mvt/) 1.5-2.6x faster than mv_q8 at 8 rows and 1.0-1.3x than the GEMM's
small-batch config at 16. Any nb >= 1 works (grid.y = ceil(nb / (8 MVT_TN))).

Launch contract (mvt.cu): grid (ceil(N / (OBM MVT_WM)), ceil(nb / (8 MVT_TN))) with OBM 16
(mvt_q8) or 8 (mvt_q8_glu), block 32 MVT_WM MVT_WK; layout 0 takes no dynamic shared memory
(static (WK - 1) WM 32 TN 4 floats for the final merge), layout 1 MVT_STAGES stage buffers of it
(smem_bytes; above 48 KiB the launch raises the kernel's limit, memra.gpu.cuda's Kernel
.allow_shared, as for the GEMM). Tunables (-D): MVT_LAYOUT (0 or 1), MVT_TN, MVT_WK, MVT_WM,
MVT_MINB; layout 0 only MVT_PREFETCH, MVT_WLOAD, MVT_KPERM, MVT_SB (variant 7, the Q4_K / Q5_K
super-block walk: MVT_WK 8, MVT_TN x MVT_WM <= 2; off unless a configuration sets it); layout 1
only MVT_UPW, MVT_STAGES
(MVT_JFIX and MVT_PIN stay at the kernel's 1); built-in configurations per batch bucket below
(layout 0), a tuning table's MVT_* laid over them (launch_config drops the other layout's
tunables, so a module's defines are the ones its layout reads).

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
_KEYS = ("MVT_TN", "MVT_WK", "MVT_WM", "MVT_PREFETCH", "MVT_WLOAD", "MVT_MINB", "MVT_KPERM",
         "MVT_LAYOUT", "MVT_UPW", "MVT_STAGES", "MVT_SB")
_LAYOUT0_ONLY = ("MVT_PREFETCH", "MVT_WLOAD", "MVT_KPERM", "MVT_SB")  # the register ring's
_SB_TYPES = (12, 13)  # MVT_SB's super-block walk: Q4_K, Q5_K (mvt.cu ignores it for the others)
_LAYOUT1_ONLY = ("MVT_UPW", "MVT_STAGES")                   # the shared-memory stages'
_LAYOUT1_DEFAULTS = {"MVT_UPW": 1, "MVT_STAGES": 3}         # mvt.cu's
_SMEM_MAX = 227 * 1024  # an H100 / H200 block's dynamic shared memory (mvt.cu's static_assert)
_NULL = np.uint64(0)


def _cfg(text: str) -> dict:
    """Layout 0: "TN,WK,WM,PREFETCH,WLOAD,MINB,KPERM"."""
    return dict(zip(_KEYS, (int(v) for v in text.split(","))))


def _cfg1(text: str) -> dict:
    """Layout 1: "TN,WK,WM,MINB,UPW,STAGES"."""
    return {"MVT_LAYOUT": 1, **dict(zip(("MVT_TN", "MVT_WK", "MVT_WM", "MVT_MINB", "MVT_UPW", "MVT_STAGES"),
                                        (int(v) for v in text.split(","))))}


# The H200's best exact configurations (experiments/mvt/mvt_check.py --nbs 8,16, 7 shapes of the
# 8B, research/2026-12-01-mvt/): one n tile per warp up to 8 rows, two from 9; 8 warps split a
# tile's slots; KPERM 1 (8-byte lane loads; Q4_K / Q5_K / Q8_0 only, ignored by the others) won
# at Q4_K 4096x4096, Q4_K glu and Q8_0. The Q6_K head wanted WK 4 / MINB 4 (a table entry's
# business); the 8-row bucket was measured at 8 rows only (2..7 run the same module).
CONFIGS = ((8, _cfg("1,8,1,2,0,2,1")), (1 << 30, _cfg("2,8,1,2,0,2,1")))
# the device check's other configurations (experiments/mvt/mvt_check.py's check_cfgs), each run
# at one (nb, glu): layout 0 the widest slot split with everything switched, and 4 tiles a block
# without a slot split; layout 1 (variant 6) the h200-mvt campaign's first (session 11's checked
# configuration), 2 tiles a block with 2 units a warp per stage in 4 stages, and 16 warps a tile
# (2 partials each) over two n tiles in 2 stages (these two: 58..93 KiB of shared memory for every
# type, above the default 48 KiB limit and within the 99 KiB an sm_89 / sm_120 block gets)
_CHECK_CONFIGS = (_cfg("1,16,1,3,1,1,1"), _cfg("2,1,4,0,0,1,0"),
                  _cfg1("1,8,1,2,1,3"), _cfg1("1,4,2,2,2,4"), _cfg1("2,16,1,1,1,2"))
_CHECK_RUNS = ((8, None, False), (15, "silu", False), (9, None, True), (5, "silu", False), (15, "gelu", False))
# variant 7 (MVT_SB, Q4_K / Q5_K only), each run at one (nb, glu, alias): the table's layout-0 tuple
# with the super-block walk, KPERM 1 and 0, and two n tiles a warp (TN 2: the 9..15-row bucket)
_SB_CONFIGS = ({**_cfg("1,8,1,2,0,2,1"), "MVT_SB": 1}, {**_cfg("1,8,1,2,0,2,0"), "MVT_SB": 1},
               {**_cfg("2,8,1,2,0,1,1"), "MVT_SB": 1})
_SB_RUNS = ((8, "silu", False), (3, None, True), (12, "gelu", False))


def default_config(nb: int) -> dict:
    for top, cfg in CONFIGS:
        if nb <= top:
            return dict(cfg)
    raise AssertionError("unreachable")


def launch_config(nb: int, config: dict | None = None) -> dict:
    """The MVT_* tunables of a launch over nb rows: default_config(nb) with `config`'s MVT_*
    (a tuning table's entry, a tune job's, kernel-check's) laid over it, keeping only the
    tunables its layout reads: layout 0 without MVT_LAYOUT and MVT_SB 0 (the kernel's defaults), MVT_UPW and
    MVT_STAGES (so its modules are the ones the layout-0 kernel always had); layout 1 without
    MVT_PREFETCH, MVT_WLOAD and MVT_KPERM, with MVT_UPW and MVT_STAGES always set."""
    c = {**default_config(nb), **{k: int(v) for k, v in (config or {}).items() if k.startswith("MVT_")}}
    layout = c.get("MVT_LAYOUT", 0)
    if layout == 0:  # MVT_SB 0 is the kernel's default: left out, as MVT_LAYOUT 0 is
        return {k: v for k, v in c.items() if k != "MVT_LAYOUT" and k not in _LAYOUT1_ONLY
                and not (k == "MVT_SB" and v == 0)}
    if layout == 1:
        return {**_LAYOUT1_DEFAULTS, **{k: v for k, v in c.items() if k not in _LAYOUT0_ONLY}}
    return c  # launch_shape refuses it


def smem_bytes(ggml_type: int, config: dict) -> int:
    """Dynamic shared memory of a launch (mvt.cu's launch contract): 0 in layout 0; in layout 1
    MVT_STAGES stages of STAGE bytes (experiments/mvt/mvt_check.py's v6_smem), STAGE = 16 WM (SU
    BPU + 16) + 16 WM roundup16(MST + 4) + 8 TN (64 SU + 16) + 8 TN 16 SU with SU = WK UPW units a
    stage, BPU = 64 BULK / BLK bulk bytes a unit and row, MST = 64 SU META / BLK meta bytes."""
    c = config
    if c.get("MVT_LAYOUT", 0) != 1:
        return 0
    _, blk, bb, _, bulk = MV.TYPES[ggml_type]
    su = c["MVT_WK"] * c.get("MVT_UPW", _LAYOUT1_DEFAULTS["MVT_UPW"])
    tr, bn = 16 * c["MVT_WM"], 8 * c["MVT_TN"]
    bpu, mst = bulk * 64 // blk, su * 64 // blk * (bb - bulk)
    stage = tr * (su * bpu + 16) + tr * ((mst + 4 + 15) // 16 * 16) + bn * (su * 64 + 16) + bn * 16 * su
    return c.get("MVT_STAGES", _LAYOUT1_DEFAULTS["MVT_STAGES"]) * stage


def launch_shape(ggml_type: int, config: dict, N: int, nb: int, glu: bool):
    """(grid, block, dynamic shared bytes) of a launch (mvt.cu's launch contract)."""
    c = config
    layout = c.get("MVT_LAYOUT", 0)
    tn, wk, wm, minb = c["MVT_TN"], c["MVT_WK"], c["MVT_WM"], c["MVT_MINB"]
    nthr = 32 * wm * wk
    if layout == 1:
        upw, stages = c.get("MVT_UPW", 1), c.get("MVT_STAGES", 3)
        bad = wk not in (4, 8, 16) or tn not in (1, 2) or upw not in (1, 2, 4) or stages < 2 or wm < 1 or \
            minb < 1 or nthr > 1024 or nthr * minb > 2048
        smem = 0 if bad else smem_bytes(ggml_type, c)
        if bad or smem > _SMEM_MAX:
            raise MemraError(f"mvt: bad configuration {c} (layout 1: MVT_WK 4, 8 or 16, MVT_TN 1 or 2, "
                             f"MVT_UPW 1, 2 or 4, MVT_STAGES >= 2, at most 1024 threads = 32 * MVT_WM * "
                             f"MVT_WK and 2048 per SM with MVT_MINB blocks, at most {_SMEM_MAX} bytes of "
                             f"shared memory: {smem})")
    elif layout == 0:
        smem = 0
        sb = c.get("MVT_SB", 0)
        if sb not in (0, 1) or (sb and ggml_type in _SB_TYPES and (wk != 8 or tn * wm > 2)):
            raise MemraError(f"mvt: bad configuration {c} (MVT_SB 0 or 1; the super-block walk of Q4_K / "
                             f"Q5_K needs MVT_WK 8 and MVT_TN x MVT_WM <= 2)")
        if wk not in (1, 2, 4, 8, 16) or tn not in (1, 2) or not 0 <= c["MVT_PREFETCH"] <= 3 or \
                c["MVT_WLOAD"] not in (0, 1) or c["MVT_KPERM"] not in (0, 1) or wm < 1 or minb < 1 or \
                nthr > 1024 or nthr * minb > 2048:
            raise MemraError(f"mvt: bad configuration {c} (MVT_WK a power of two <= 16, MVT_TN 1 or 2, "
                             f"MVT_PREFETCH 0..3, MVT_WLOAD / MVT_KPERM 0 or 1, at most 1024 threads = 32 * "
                             f"MVT_WM * MVT_WK and 2048 per SM with MVT_MINB blocks)")
    else:
        raise MemraError(f"mvt: bad configuration {c} (MVT_LAYOUT 0 or 1)")
    obm = (8 if glu else 16) * wm
    return ((N + obm - 1) // obm, (nb + 8 * tn - 1) // (8 * tn)), (nthr,), smem


def _defines(ggml_type: int, config: dict, canary: int = 0) -> dict:
    d = {"MV_TYPE": ggml_type, **config}
    if ggml_type not in _SB_TYPES or not d.get("MVT_SB"):
        d.pop("MVT_SB", None)  # the kernel ignores it: the same module as without
    if config.get("MVT_LAYOUT", 0) == 1:
        # the kernel asserts at compile time that its stages take what the launch passes
        d["MVT_EXPECT_SMEM"] = smem_bytes(ggml_type, config)
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
    MV.check_glu("mvt", glu, w.rows)
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
    grid, block, smem = launch_shape(t, cfg, N, nb, bool(glu))
    k = g.module(KERNEL_FILE, _defines(t, cfg, canary)).kernel("mvt_q8_glu" if glu else "mvt_q8")
    # layout 1 above 48 KiB: g.launch raises the kernel's dynamic shared-memory limit first
    # (memra.gpu.cuda's Kernel.allow_shared), as it does for the GEMM
    g.launch(k, grid, block, (w.bulk, w.meta, xq, xs, y, residual if residual is not None else _NULL,
                              np.int32(N), np.int32(K), np.int32(nb), np.int32(MV.ACTS[glu])), shmem=smem, pdl=pdl)


# -- kernel-check -----------------------------------------------------------------------

_CHECK_NB = (2, 5, 8, 9, 15)  # both built-in buckets, partial n tiles, one and two tiles
_CHECK_N, _CHECK_K = 200, 2560  # nu = 40 units a row: uneven slots; 200 rows: a partial last tile


def compile_variants() -> list[tuple[str, dict]]:
    """Every module checks() and canaries() load: both layouts."""
    out = []
    for t in TYPES:
        for cfg in [c for _, c in CONFIGS] + [launch_config(nb, c) for c, (nb, _, _) in zip(_CHECK_CONFIGS, _CHECK_RUNS)]:
            out.append((KERNEL_FILE, _defines(t, cfg)))
    for t in _SB_TYPES:
        for cfg, (nb, _, _) in zip(_SB_CONFIGS, _SB_RUNS):
            out.append((KERNEL_FILE, _defines(t, launch_config(nb, cfg))))
    out.append((KERNEL_FILE, _defines(12, default_config(8), canary=1)))
    out.append((KERNEL_FILE, _defines(12, launch_config(8, _SB_CONFIGS[0]), canary=1)))
    out.append((KERNEL_FILE, _defines(12, launch_config(8, _CHECK_CONFIGS[2]), canary=1)))
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
        # the device check's other configurations, both layouts
        for cfg, (nb, glu, alias) in zip(_CHECK_CONFIGS, _CHECK_RUNS):
            yield _case(g, rng, t, nb, glu, alias=alias, config=cfg)
        # layout 1 on 12 units a row (nu < 32: empty slots; one full and one partial stage) and,
        # for Q6_K, an odd count of 18-byte super-block metas (rows' meta windows 2 bytes in)
        yield _case(g, rng, t, 7, None, alias=False, config=_CHECK_CONFIGS[2], N=72, K=768)
    # variant 7 on 40 units a row (10 super-blocks over 8 warps: uneven), on 12 (3 super-blocks:
    # warps without one) and, for Q4_K, on an 8B gate+up's K at 4 and 8 rows
    for t in _SB_TYPES:
        for cfg, (nb, glu, alias) in zip(_SB_CONFIGS, _SB_RUNS):
            yield _case(g, rng, t, nb, glu, alias=alias, config=cfg)
        yield _case(g, rng, t, 7, None, alias=False, config=_SB_CONFIGS[0], N=72, K=768)
    # the K-quant and Q6_K shapes of an 8B layer's matvecs at decode batches
    for t, N, K, glu in ((12, 512, 4096, "silu"), (14, 256, 14336, None)):
        for nb in (4, 12):
            yield _case(g, rng, t, nb, glu, alias=glu is None, N=N, K=K)
    for nb in (4, 8):
        yield _case(g, rng, 12, nb, "silu", alias=False, config=_SB_CONFIGS[0], N=512, K=4096)


def canaries(g, rng: np.random.Generator) -> Iterator:
    yield _case(g, rng, 12, 8, None, alias=False, canary=1)
    yield _case(g, rng, 12, 8, None, alias=False, canary=1, config=_CHECK_CONFIGS[2])  # layout 1
    yield _case(g, rng, 12, 8, None, alias=False, canary=1, config=_SB_CONFIGS[0])     # variant 7


# -- the tune hooks (kernel "mvt" | "mvt_glu", config MVT_*) and the launch-set hooks (op
# "mvt": the q8 path at MVT_MIN_ROWS..GEMM_MIN_ROWS - 1 rows): gemm's (memra.gpu.ops.gemm.Hooks)
# on this family's launcher and configuration functions

HOOKS = GEMM.Hooks("mvt", sys.modules[__name__], KERNEL_FILE, _KEYS, launch_config, default_config,
                   lambda t, cfg, N, nb, glu: launch_shape(t, cfg, N, nb, glu), _defines)
tune_case, is_builtin, tune_modules = HOOKS.tune_case, HOOKS.is_builtin, HOOKS.tune_modules
TUNE_VARIANTS = HOOKS.tune_variants
launch_cases, check_launch = HOOKS.launch_cases, HOOKS.check_launch
