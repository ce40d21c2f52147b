"""Quantized products on the tensor cores in the chain order (kernels/gemm_tile.cu): every output one
float32 chain over the k32 blocks in increasing k (memra.gpu.chain gives the operations), so a row's
bits do not depend on the batch, the tile or the configuration.

    gemm_tile(g, w, y, xq=xq, xs=xs, nb=nb)            # y[b, :] = W x[b, :], b < nb
        residual=r   y = fl(W x + r) (r may be y itself)
        glu="silu"|"gelu"   W holds [gate; up] (2N rows): y = fl(act(gate x) * (up x))

Weight types: Q4_0, Q8_0, Q4_K, Q6_K (memra.gpu.chain.TYPES), in memra.gpu.ops.matvec's planes
layout. Tunables (-D): GT_WM, GT_WN, GT_STAGES, GT_PF, GT_MINB, GT_LD (the loader's mapping), GT_RPAD
(the row records' padding); per type the configuration the H200 measured fastest at 512 rows
(research/2026-12-02-session16, ab/), the 2 x 2-warp tile with 3 stages up to SMALL_ROWS rows.

Where the engine uses it: the prompt rows of MEMRA_ATTN=hybrid (memra.gpu.plan: a row's arithmetic
is fixed by its kind, prompt or generated) on the weights `supports` accepts — the chain is not the
order of mv_q8 / gemm.cu (the generated rows' path), so a prompt row's layer outputs differ in bits
from a decode row's at the same position, as its attention already does under hybrid.

The oracle (kernel-check): plain outputs bit for bit memra.gpu.chain.chain on the same q8
activations (and the float64 product at matvec's TOL); with a residual, fl(chain + r); glu outputs
bit for bit act_mul (kernels/act.cu, the engine's own activation) of the plain kernel's gate and up
outputs, which are themselves checked against the chain.

The tune hooks (memra/tune/measure.py): tune_case, is_builtin, tune_modules for kernels gemm_tile /
gemm_tile_glu, variant "chain" (the planner's table lookup for the prompt tile), GT_* configurations
laid over default_config(type, batch); a job's check holds it to the float64 product and to the
chain's bits (tune/campaigns/h200-gemm-tile.toml).
"""

from __future__ import annotations

from typing import Iterator

import numpy as np

from memra.errors import MemraError
from memra.gpu import chain as CH
from memra.gpu.ops import matvec as MV
from memra.gpu.ops import tile_shape_problems
from memra.gpu.q8 import Q8_SCALE, quantize_q8_ref

# -- the launch and host contract (kernels/gemm_tile.cu's header) ------------------------

Q4_0, Q8_0, Q4_K, Q6_K = 2, 8, 12, 14
TYPE_NAMES = {Q4_0: "Q4_0", Q8_0: "Q8_0", Q4_K: "Q4_K", Q6_K: "Q6_K"}
# per type: raw tile row stride WS, staged meta bytes a row MS, float-area bytes per weight row (RS) and
# per activation column (CS), K multiple
GEOM = {
    Q4_0: dict(WS=144, MS=16, RS=64, CS=32, KMUL=256),
    Q8_0: dict(WS=272, MS=16, RS=64, CS=32, KMUL=256),
    Q4_K: dict(WS=144, MS=16, RS=96, CS=64, KMUL=256),
    Q6_K: dict(WS=208, MS=20, RS=68, CS=32, KMUL=512),
}
SMEM_MAX = 232448   # 227 KiB: the sm_90 opt-in limit a block
RPAD = 1   # kernels/gemm_tile.cu's GT_RPAD default (smem_bytes follows it)
# best timed configurations (research/2026-12-02-session16/ab/*.txt, 512 rows, exact chain):
#   Q4_K gate + up 2 x 14336 x 4096: "t2 F1 2,4,2 pf2" 740.7 us (F1 pf1 spilled); 4096 x 14336 350.8
#   Q4_0: "2,4,2 pf2" gate + up 626.1, 4096 x 14336 312.3, 4096 x 4096 95.1 (pf1 94.9)
#   Q8_0: "2,4,2 pf2" gate + up 697.0, 4096 x 14336 333.4 (pf1 330.9), 4096 x 4096 100.1 (pf1 99.9)
#   Q6_K: "q6 F1 2,4,2" (GT_PF 1) 4096 x 14336 465.7, 4096 x 4096 136.4
_DEFAULTS = {
    Q4_K: dict(GT_WM=2, GT_WN=4, GT_STAGES=2, GT_PF=2, GT_MINB=1),
    Q4_0: dict(GT_WM=2, GT_WN=4, GT_STAGES=2, GT_PF=2, GT_MINB=1),
    Q8_0: dict(GT_WM=2, GT_WN=4, GT_STAGES=2, GT_PF=2, GT_MINB=1),
    Q6_K: dict(GT_WM=2, GT_WN=4, GT_STAGES=2, GT_PF=1, GT_MINB=1),
}


def type_config(ggml_type: int) -> dict:
    if ggml_type not in _DEFAULTS:
        raise MemraError(f"gemm_tile: no tile kernel for {MV.TYPES[ggml_type][0]} weights "
                         f"(it has {', '.join(TYPE_NAMES.values())})")
    return dict(_DEFAULTS[ggml_type])


def _cfg(ggml_type: int, config: dict | None) -> dict:
    c = type_config(ggml_type)
    c.update(config or {})
    return c


def tile(ggml_type: int, config: dict | None = None) -> tuple[int, int, int]:
    """(BM weight rows, BN activation columns, NT threads) of a block."""
    c = _cfg(ggml_type, config)
    wm, wn = int(c["GT_WM"]), int(c["GT_WN"])
    return 64 * wm, 32 * wn, 32 * wm * wn


def smem_bytes(ggml_type: int, config: dict | None = None) -> int:
    """GT_STAGES (BM WS + BN 272 + BM MS + BN 64) + 2 (RS BM + CS BN), RS + 16 with GT_RPAD where
    that fits SMEM_MAX (a lane's group of 8 row records padded by 16 bytes: gemm_tile.cu's RPAD)."""
    g = GEOM[ggml_type]
    c = _cfg(ggml_type, config)
    bm, bn, _ = tile(ggml_type, c)
    ns = int(c["GT_STAGES"])
    stages = ns * (bm * g["WS"] + bn * 272 + bm * g["MS"] + bn * 64)
    padded = stages + 2 * ((g["RS"] + 16) * bm + g["CS"] * bn)
    if int(c.get("GT_RPAD", RPAD)) and padded <= SMEM_MAX:
        return padded
    return stages + 2 * (g["RS"] * bm + g["CS"] * bn)


def check_config(ggml_type: int, config: dict | None = None) -> None:
    """The kernel's static_asserts, on the host."""
    c = _cfg(ggml_type, config)
    bm, bn, nt = tile(ggml_type, c)
    wn, ns, pf = int(c["GT_WN"]), int(c["GT_STAGES"]), int(c.get("GT_PF", 1))
    cpr = (GEOM[ggml_type]["WS"] - 16) // 16
    bad = []
    if wn < 2 or ns < 2 or nt < bm or nt < bn:
        bad.append("GT_WN >= 2, GT_STAGES >= 2")
    if (bm * cpr) % nt or cpr % max(1, bm * cpr // nt) or (bn * 16) % nt or 16 % max(1, bn * 16 // nt) \
            or (bn * 4) % nt or bn * 4 // nt < 1 or 8 % (nt // bm) or 8 % (nt // bn):
        bad.append("loader / scalar-pass shares")
    if not (0 <= pf <= (1 if ggml_type == Q6_K else 2)):
        bad.append("GT_PF")
    if smem_bytes(ggml_type, c) > SMEM_MAX:
        bad.append(f"shared memory {smem_bytes(ggml_type, c)} > {SMEM_MAX}")
    if bad:
        raise MemraError(f"gemm_tile {TYPE_NAMES[ggml_type]} {c}: " + "; ".join(bad))


def check_shape(ggml_type: int, config: dict | None, N: int, K: int, nb: int, glu: bool) -> None:
    """The host contract (the kernel's header): a type it has, N a multiple of the output tile
    (OBM = BM, glu BM / 2: no partial row tile), K of the type's step (256; Q6_K 512), nb >= 1,
    32-bit offsets."""
    check_config(ggml_type, config)
    bm, bn, _ = tile(ggml_type, config)
    obm = bm // 2 if glu else bm
    bad = tile_shape_problems(N, obm, K, GEOM[ggml_type]["KMUL"], nb)
    rows = 2 * N if glu else N
    bulk_row = K // 256 * (GEOM[ggml_type]["WS"] - 16)
    if nb * K >= 2 ** 32 or rows * bulk_row >= 2 ** 32 or nb * (K // 32) * 8 >= 2 ** 32:
        bad.append("32-bit element offsets overflow")
    if bad:
        raise MemraError(f"gemm_tile {TYPE_NAMES[ggml_type]}{' glu' if glu else ''}: " + "; ".join(bad))


def launch_shape(ggml_type: int, config: dict | None, N: int, nb: int, glu: bool):
    """((N / OBM, ceil(nb / BN), 1), (NT, 1, 1), smem bytes). N = output rows."""
    check_config(ggml_type, config)
    bm, bn, nt = tile(ggml_type, config)
    obm = bm // 2 if glu else bm
    if N % obm or nb < 1:
        raise MemraError(f"gemm_tile: N = {N} must be a multiple of {obm}, nb >= 1")
    return (N // obm, -(-nb // bn), 1), (nt, 1, 1), smem_bytes(ggml_type, config)


KERNEL_FILE = "gemm_tile.cu"
TYPES = CH.TYPES
KEYS = ("GT_WM", "GT_WN", "GT_STAGES", "GT_PF", "GT_MINB", "GT_LD", "GT_RPAD")
_NULL = np.uint64(0)


# up to this many rows the 2 x 2-warp tile with 3 stages (64 activation columns a block) is the
# built-in: at 64 rows it ran the Q4_K gate + up in 156.0 µs against 371.1 for the 2 x 4 tile, Q6_K
# 4096 x 14336 in 308.2 against 504.8, Q8_0 6144 x 4096 in 65.2 against 147.8; at 128 rows the 2 x 4
# tile wins (Q4_K gate + up 216.7 against 304.1; research/2026-12-02-session16/ab/)
SMALL_ROWS = 64
_SMALL = {"GT_WM": 2, "GT_WN": 2, "GT_STAGES": 3}


def default_config(t: int, nb: int = 512) -> dict:
    """The built-in tunables of a launch over nb rows (a table entry per row bucket overrides them).
    The chain does not depend on the configuration, so it may change with the row count."""
    c = dict(type_config(t))
    return {**c, **_SMALL} if nb <= SMALL_ROWS else c


def launch_config(t: int, nb: int = 512, config: dict | None = None) -> dict:
    """default_config(t, nb) with `config`'s GT_* (a table entry, a tune job's, kernel-check's) over it."""
    return {**default_config(t, nb), **{k: int(v) for k, v in (config or {}).items() if k.startswith("GT_")}}


# the fewest output-row tiles (N / OBM at the 512-row configuration) a weight needs for the prompt
# rows to take the tile: a 512-row chunk then runs >= 4 x 32 = 128 blocks. Below it the grid leaves
# SMs idle (Q6_K attn_v 1024 x 4096, 8 tiles: 136.4 µs against gemm.cu's 77.3 at 512 rows; the
# 1B's 2048 x 8192 Q4_0, 16 tiles: 118.1 against 117.2, parity; session 16, ab/). 16 -> 32 in
# session 20: the 1B's 2,048- and 3,072-row weights (16 and 24 tiles) back on gemm.cu, pp512
# 50,610 / 50,809 -> 58,042 / 56,121 t/s, arms alternating (research/2026-12-03-session20, a/);
# the 8B's weights all have >= 32
MIN_ROW_TILES = 32


def supports(t: int, N: int, K: int, glu: bool, min_tiles: int | None = None) -> bool:
    """Whether the engine's prompt rows take the tile for a weight of type t with N output rows
    (glu: 2N weight rows) of K: a type it has, the host contract of the 512-row configuration and
    of the small one (N a multiple of both output tiles, K of the type's step), and at least
    MIN_ROW_TILES output tiles (min_tiles: the planner's MEMRA_TILE_MIN). A function of the weight
    alone, never of the row count: a prompt row's bits must not depend on the chunk it is in."""
    if t not in TYPES:
        return False
    try:
        for nb in (1, 512):
            check_shape(t, launch_config(t, nb), N, K, nb, glu)
    except MemraError:
        return False
    bm = tile(t, launch_config(t, 512))[0]
    return N // (bm // 2 if glu else bm) >= (MIN_ROW_TILES if min_tiles is None else min_tiles)


def gemm_tile(g, w, y, *, xq, xs, nb: int, residual=None, glu: str | None = None, config: dict | None = None,
              canary: int = 0, pdl: bool = False) -> None:
    """y[b, :] (+)= W x[b, :] for b < nb on the q8 activations xq / xs, every output the chain."""
    t = w.ggml_type
    MV.check_glu("gemm_tile", glu, w.rows)
    N, K = (w.rows // 2 if glu else w.rows), w.K
    cfg = launch_config(t, nb, config)
    check_shape(t, cfg, N, K, nb, bool(glu))
    if xq.dtype != np.int8 or xs.dtype != Q8_SCALE or xq.size < nb * K or xs.size < nb * K // 32:
        raise MemraError("gemm_tile: xq/xs must be int8 / Q8_SCALE with nb rows of K")
    if y.dtype != np.float32 or y.size < nb * N or (residual is not None and residual.size < nb * N):
        raise MemraError(f"gemm_tile: y (and residual) must be f32 with >= {nb}x{N} values")
    grid, block, smem = launch_shape(t, cfg, N, nb, bool(glu))
    k = g.module(KERNEL_FILE, MV.type_defines(t, cfg, canary)).kernel("gemm_tile_glu" if glu else "gemm_tile")
    g.launch(k, grid, block, (w.bulk, w.meta, xq, xs, y, residual if residual is not None else _NULL,
                              np.int32(N), np.int32(K), np.int32(nb), np.int32(MV.ACTS[glu])), shmem=smem, pdl=pdl)


# -- kernel-check -----------------------------------------------------------------------

TOL = MV.TOL
# (nb, glu, residual aliasing y): one row, partial column tiles, a full 128-column tile
_CHECK = ((1, None, False), (9, None, False), (64, "silu", False), (130, None, True), (33, "gelu", False),
          (128, None, False))


def compile_variants() -> list[tuple[str, dict]]:
    out = [(KERNEL_FILE, MV.type_defines(t, launch_config(t, nb))) for t in TYPES for nb in (SMALL_ROWS, 512)]
    out.append((KERNEL_FILE, MV.type_defines(12, launch_config(12), canary=1)))
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
        want_out = ACT.act_mul_of(g, got, MV.ACT_MUL[glu])
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
    K = K or 4 * GEOM[t]["KMUL"]
    raw = MV.random_weight(t, 2 * N if glu else N, K, rng)
    name = (f"gemm_tile {MV.TYPES[t][0]} nb={nb} {N}x{K}{' glu-' + glu if glu else ''}"
            f"{' +res(alias y)' if alias else ''}"
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


# -- the launch set (memra.tune.launches: the engine's own launches, run by kernel-check) ----------

_LAUNCH_N = 128   # output rows checked of a larger weight (a multiple of every output tile)


def launch_cases(L, ctx) -> list[dict]:
    """A plan launch of op gemm_tile: the module the launcher builds at its row count
    (launch_config(nb) with the launch's tunables over it), the exact batch, the K it loops over
    and whether the output aliases the residual."""
    t = MV.type_id(L.shape["type"])
    glu, nb, K = L.args.get("glu"), int(L.rows), int(L.shape["cols"])
    N = int(L.shape["rows"]) // (2 if glu else 1)
    cfg = launch_config(t, nb, L.config)
    res = bool(L.args.get("res"))
    return [{"file": KERNEL_FILE, "entry": "gemm_tile_glu" if glu else "gemm_tile", "defines": MV.type_defines(t, cfg),
             "bucket": nb, "tag": f"K{K}" + (" res=y" if res else ""),
             "params": {"type": t, "N": N, "K": K, "nb": nb, "glu": glu, "res": res}}]


def check_launch(g, rng, case):
    """The launch's module at its batch, K and residual aliasing on a random weight (at most
    _LAUNCH_N output rows), against the chain bit for bit and the float64 product."""
    p = case["params"]
    t, nb, K, glu, alias = p["type"], p["nb"], p["K"], p["glu"], p["res"]
    N = min(p["N"], _LAUNCH_N)
    cfg = {k: v for k, v in case["defines"].items() if k in KEYS}
    raw = MV.random_weight(t, 2 * N if glu else N, K, rng)
    name = f"{case['entry']} {MV.TYPES[t][0]} nb={nb} {N}x{K}{' res=y' if alias else ''} {cfg}"
    return against_chain(g, rng, name, t, raw, nb, glu, alias, cfg)


# -- the tune hooks (memra/tune/measure.py; campaign tune/campaigns/h200-gemm-tile.toml): kernel
# "gemm_tile" | "gemm_tile_glu", variant "chain", shape {type, rows (2N for _glu: gate and up
# stacked), cols, batch}; config GT_* laid over default_config(type, batch) (launch_config, as the
# plan's table entries are). The outputs do not depend on the configuration, so every one is
# checked against the same bits.

VARIANT = "chain"
# the kernels tune_case measures and their variants (memra tune run checks a campaign's names against them)
TUNE_VARIANTS = {"gemm_tile": (VARIANT,), "gemm_tile_glu": (VARIANT,)}
_TUNE_ROWS = 128   # output rows whose bits a tune check takes from the chain on the host (~2.6 ns an element)
# Per (batch, glu) of the cached weight (memra.gpu.ops.matvec's shape cache): the q8 activations,
# the float64 product and the reference bits, made once for all the configurations of a shape
# and batch (a campaign runs them in a row; the host chain is the costly part)
_INPUTS: dict[tuple, tuple] = {}


def _tune_args(kernel: str, variant: str, config: dict, shape: dict):
    """(type id, glu, N, K, nb, launch config) of a tune job, or MemraError: unknown kernel,
    variant, type or tunable, or a configuration check_shape refuses (before any compile)."""
    if variant not in TUNE_VARIANTS.get(kernel, ()):
        raise MemraError(f"gemm_tile tune: unknown kernel/variant {kernel}/{variant}")
    t = MV.type_id(shape["type"])
    if t not in TYPES:
        raise MemraError(f"gemm_tile tune: {shape['type']} has no tile kernel")
    bad = sorted(set(config or {}) - set(KEYS))
    if bad:
        raise MemraError(f"gemm_tile tune: unknown tunables {bad} (known: {', '.join(KEYS)})")
    glu, rows, K, nb = kernel == "gemm_tile_glu", int(shape["rows"]), int(shape["cols"]), int(shape.get("batch", 1))
    if glu and rows % 2:
        raise MemraError(f"gemm_tile tune: a gemm_tile_glu weight stacks gate and up (an even row count, got {rows})")
    N = rows // 2 if glu else rows
    cfg = launch_config(t, nb, config)
    check_shape(t, cfg, N, K, nb, glu)
    return t, glu, N, K, nb, cfg


class _TuneCase:
    """The shape's weight in the planes layout (copies rotating past the L2: memra.gpu.ops.matvec's
    shape cache), nb rows of q8 activations, the job's configuration. The reference bits: the
    chain (act_mul of its gate and up rows for glu, as against_chain) for the first _TUNE_ROWS
    outputs, the built-in configuration's launch for the rest (the outputs do not depend on the
    configuration, and kernel-check holds the built-in one to the chain)."""

    def __init__(self, g, t, glu, N, K, nb, cfg, rng, rotate_bytes):
        self.g, self.t, self.glu, self.N, self.K, self.nb, self.cfg = g, t, glu, N, K, nb, cfg
        self.ws, self.wf, raw = MV._shape_weights(g, t, 2 * N if glu else N, K, rng, rotate_bytes, raw=True)
        self.sets = len(self.ws)
        hit = _INPUTS.get((nb, glu))
        if hit is None or hit[0] is not self.ws[0]:  # the weight object itself: ids are reused
            _INPUTS.clear()
            hit = _INPUTS[(nb, glu)] = (self.ws[0], self._inputs(raw, rng))
        self.xq, self.xs, self.ref, self.bits = hit[1]
        self.y = g.empty((nb, N), np.float32)
        self.bytes = self.ws[0].nbytes + nb * (K + K // 32 * Q8_SCALE.itemsize + N * 4)

    def _inputs(self, raw, rng):
        from memra.gpu.ops import act as ACT

        g, t, nb, K, N, act = self.g, self.t, self.nb, self.K, self.N, "silu" if self.glu else None
        x = (rng.standard_normal((nb, K)) * rng.uniform(0.5, 4)).astype(np.float32)
        xq, xs = g.empty((nb, K), np.int8), g.empty((nb, K // 32), Q8_SCALE)
        MV.quantize_q8(g, g.to_device(x), xq, xs, nb)
        q, s = quantize_q8_ref(x)
        xv = (q.reshape(nb, -1, 32).astype(np.float64) * s["d"][..., None]).reshape(nb, K)
        R = min(N, _TUNE_ROWS)
        want = CH.chain(raw[np.r_[0:R, N:N + R]] if act else raw[:R], t, q, s["d"], s["s"])  # [nb, R (gate, up)]
        if act:
            gu, out = g.to_device(np.ascontiguousarray(want)), g.empty((nb, R), np.float32)
            ACT.act_mul(g, gu.view(np.float32, (nb * 2 * R,), 0), gu.view(np.float32, (nb * 2 * R - R,), 4 * R),
                        out, R, nb, MV.ACT_MUL[act], gate_stride=2 * R, up_stride=2 * R, out_stride=R)
            g.sync()
            want = out.numpy()
        bits = np.empty((nb, N), np.uint32)
        bits[:, :R] = want.view(np.uint32)
        if R < N:
            yb = g.empty((nb, N), np.float32)
            yb.poison()
            gemm_tile(g, self.ws[0], yb, xq=xq, xs=xs, nb=nb, glu=act)
            g.sync()
            bits[:, R:] = yb.numpy().view(np.uint32)[:, R:]
        return xq, xs, MV.matvec_ref(self.wf, xv, None, act), bits

    def launch(self, i: int) -> None:
        gemm_tile(self.g, self.ws[i % self.sets], self.y, xq=self.xq, xs=self.xs, nb=self.nb,
                  glu="silu" if self.glu else None, config=self.cfg)

    def check(self):
        """One launch on a poisoned y: the float64 product at TOL, then the reference bits."""
        from memra.gpu.compare import compare

        self.y.poison()
        self.launch(0)
        self.g.sync()
        got = self.y.numpy()
        o = compare("gemm_tile", got, self.ref, TOL)
        if not o.ok:
            return False, o.err, o.detail
        diff = got.view(np.uint32) != self.bits
        R = min(self.N, _TUNE_ROWS)
        if diff.any():
            rest = f", {int(diff[:, R:].sum())} of {self.nb * (self.N - R)} from the built-in configuration's" \
                if R < self.N else ""
            return False, o.err, f"{int(diff[:, :R].sum())} of {self.nb * R} values differ from the chain's bits{rest}"
        rest = f" ({R} rows; the rest = the built-in configuration's)" if R < self.N else ""
        return True, o.err, o.detail + "; = chain bit for bit" + rest


def tune_case(g, kernel: str, variant: str, config: dict, shape: dict, rng, rotate_bytes: int):
    t, glu, N, K, nb, cfg = _tune_args(kernel, variant, config, shape)
    return _TuneCase(g, t, glu, N, K, nb, cfg, rng, rotate_bytes)


def is_builtin(kernel: str, variant: str, config: dict, shape: dict) -> bool:
    """Whether a tune job's configuration is what the launcher runs at its batch without a table."""
    t, nb = MV.type_id(shape["type"]), int(shape.get("batch", 1))
    return t in TYPES and launch_config(t, nb, config) == default_config(t, nb)


def tune_modules(kernel: str, variant: str, config: dict, shape: dict) -> list[tuple[str, dict]]:
    """The module a tune job loads, for the campaign's parallel precompile (a refused
    configuration raises: never compiled, its job records why)."""
    t, _, _, _, _, cfg = _tune_args(kernel, variant, config, shape)
    return [(KERNEL_FILE, MV.type_defines(t, cfg))]
