"""The generated rows' Q4_K and Q6_K matmuls in the "qf" arithmetic (kernels/qf.cu; MEMRA_DECODE=qf): integer
weights times f16 activations through the tensor core, one f32 fold a superblock, so a row's bits
depend neither on the batch, the rows beside it, the kernel (qf_mv up to 8 rows, qf_gemm above) nor
any tunable but the chain count, which is fixed by the weight's shape alone (`chains`).

    to_qf(g, x, xh, xs2, nb, K)                       # the activations: f16 in qf order + the S2 sums
    qf(g, w, y, xh=xh, xs2=xs2, nb=nb, ws=ws, cnt=cnt)  # y[b, :] = W x[b, :], b < nb
        residual=r   y = fl(r + W x) (r may be y itself)
        glu="silu"|"gelu"   W holds [gate; up] (2N rows): y = fl(act(gate x) * (up x))

Weights: Q4_K (type 12) or Q6_K (14) in memra.gpu.ops.matvec's planes layout, the engine's own upload
(no copy). What it computes (kernels/qf.cu's header): Q4_K, per output and superblock, D1 = the
tensor core's f32 sum of (sc q) x (sc q <= 945, exact in f16; x f16), D2 = its f32 sum of m S2
(tf32, S2 split hi + lo), acc = fma(-dmin, D2, fma(d, D1, acc)); Q6_K, per 16-element sub-block, D
= its f32 sum of (q - 32) x (exact in f16), acc = fma(d sc, D, acc) (d sc exact in f32); QF_CHAINS
runs of superblocks folded left. Not
mv_q8's arithmetic (its activations are q8: 8 significant bits relative to a 32-block's largest;
here 11 each), so a plan's generated rows take one or the other as a whole (memra.gpu.plan).

Measured (experiments/f16_decode/README.md, sessions 54-55, H100, the 8B's Q4_K shapes): 64 rows
0.57-0.72x gemm.cu (gate+up 93.9 µs against 154.6), 8 rows 0.69-0.81x mvt, one row 1.05-1.28x
mv_q8; every output at 1, 8 and 64 rows equal to the one-row launches bit for bit. Q6_K (session 56): kernel-checked
on the H200 (research/2026-12-07-session56), not yet timed. The head (MEMRA_QF_HEAD=1, session 57) and qf's table entries
(tune/campaigns/h200-qf.toml, session 57, the H100 standing in: at 64 rows ~205-213 µs of an 8B layer, the head 429).

The oracle (kernel-check): the float64 value of the same arithmetic (the Q4_K integers, d sc and
dmin m exact, the f16 activations, S2 = hi + lo as the kernel reads it) at TOL of the largest
|output|; bit for bit: to_qf against its host replay (`producer`), rows of an nb-row launch equal
launches over those rows alone, qf_mv equal to qf_gemm and every configuration the built-in one's
bits, glu outputs act_mul of the plain kernel's gate and up outputs, a residual's fl(plain + r).
"""

from __future__ import annotations

from typing import Iterator

import numpy as np

from memra.errors import MemraError
from memra.gpu.ops import launch_bucket
from memra.gpu.ops import matvec as MV

# -- the launch and host contract (kernels/qf.cu's header) ---------------------------------

KERNEL_FILE = "qf.cu"
TYPES = (12, 14)   # Q4_K, Q6_K (the module's QF_TYPE: passed where it is not 12, the kernel's default)
KEYS = ("QF_WARPS", "QF_CHAINS", "QF_GWARPS", "QF_NT", "QF_STAGES", "QF_KSPLIT", "QF_WSMEM", "QF_AHEAD", "QF_TYPE")
MV_KEYS = ("QF_WARPS", "QF_AHEAD")                                          # qf_mv's own
GEMM_KEYS = ("QF_GWARPS", "QF_NT", "QF_STAGES", "QF_KSPLIT", "QF_WSMEM")    # qf_gemm's own
MV_ROWS = 8          # qf_mv takes up to this many activation rows (a warp's n8 tile)
KSPLIT_ROWS = 64     # qf_gemm splits its chains across blocks up to this many rows (the workspace's bound)
# and for weights of at most this many output rows: a longer one fills the machine with its row tiles alone (the 8B's
# head: 8,016 tiles of 16), where a split's workspace would be chains x N x rows floats (131 MB for that head)
KSPLIT_N = 32768
# qf_gemm's shared memory a weight type: a staged activation row (halves), weight row (bytes), a row's meta (bytes)
GEOM = {12: (288, 160, 16), 14: (272, 208, 20)}
SMEM_MAX = 232448    # 227 KiB: the sm_90 opt-in limit a block
TO_QF_THREADS = 256  # to_qf: a warp a superblock of a row, 8 a block
_NULL = np.uint64(0)


def _name(t: int) -> str:
    return MV.TYPES[t][0] if t in MV.TYPES else f"type {t}"


def chains(N: int, K: int, glu: bool) -> int:
    """The chain count of a weight (the arithmetic: part of every output's bits), by its shape alone: a gate+up
    weight two where K holds an even count of superblocks (one chain: 64 rows 11 % faster, one row 1.3-1.5x slower,
    the serve A/B's c = 1 -18.5 %; research/2026-12-07-session55), the others 4 where K holds a multiple of 4
    superblocks (qkv / attn_output / down at 64 rows: 4 chains split across blocks), else 2, else 1."""
    for c in ((2,) if glu else (4, 2)):
        if K % (256 * c) == 0:
            return c
    return 1


def default_config(nb: int, N: int, K: int, glu: bool, t: int = 12) -> dict:
    """The built-in tunables of a launch over nb rows: qf_mv's (QF_WARPS max(4, chains), QF_AHEAD 1) up to MV_ROWS
    rows; above, qf_gemm's with the weights staged through shared memory (QF_WSMEM 1: session 55's best on every
    64-row shape), 8 warps of QF_NT 4 n8 tiles from 17 rows (2 below); the chains split across blocks (QF_KSPLIT)
    up to KSPLIT_ROWS rows except a gate+up's (its two chains walked by one warp: 105.6 µs at 64 rows against
    114.9 split) and a weight of more than KSPLIT_N rows; QF_TYPE t where t is not Q4_K."""
    c = chains(N, K, glu)
    cfg = {"QF_WARPS": max(4, c), "QF_CHAINS": c, **({"QF_TYPE": t} if t != 12 else {})}
    if nb <= MV_ROWS:
        return {**cfg, "QF_AHEAD": 1}
    return {**cfg, "QF_GWARPS": 8, "QF_NT": 4 if nb > 16 else 2, "QF_STAGES": 2,
            "QF_KSPLIT": int(c > 1 and nb <= KSPLIT_ROWS and not glu and N <= KSPLIT_N), "QF_WSMEM": 1}


def is_gemm(config: dict) -> bool:
    return any(k in config for k in GEMM_KEYS)


def launch_config(nb: int, N: int, K: int, glu: bool, config: dict | None = None, t: int = 12) -> dict:
    """The launch's tunables: `config` (a table entry, kernel-check's case) over default_config; its kernel is
    qf_gemm where it names qf_gemm's tunables or nb > MV_ROWS, else qf_mv. QF_CHAINS is the shape's (`chains`):
    a configuration naming another count (or weight type than t) is refused (it would be another arithmetic)."""
    own = {k: int(v) for k, v in (config or {}).items() if k.startswith("QF_")}
    c = chains(N, K, glu)
    if own.get("QF_CHAINS", c) != c:
        raise MemraError(f"qf: QF_CHAINS={own['QF_CHAINS']} is not the weight's chain count {c} (the arithmetic: "
                         f"memra.gpu.ops.qf.chains, by the shape alone)")
    if own.get("QF_TYPE", t) != t:
        raise MemraError(f"qf: QF_TYPE={own['QF_TYPE']} is not the weight's type {t}")
    gemm = nb > MV_ROWS or is_gemm(own)
    return {**default_config(max(nb, MV_ROWS + 1) if gemm else nb, N, K, glu, t), **own}


def smem_bytes(cfg: dict) -> int:
    """qf_gemm's dynamic shared memory: QF_STAGES stages of 8 QF_NT activation rows (XROW halves and 16 sums
    each: Q6_K stages no sums but keeps their room), with QF_WSMEM each warp's 16 weight rows and their meta, and
    without QF_KSPLIT a multi-chain tile's parked sums (GEOM by the weight type); qf_mv none."""
    if not is_gemm(cfg):
        return 0
    st, nt, gw = cfg["QF_STAGES"], cfg["QF_NT"], cfg["QF_GWARPS"]
    xrow, wrow, mrow = GEOM[cfg.get("QF_TYPE", 12)]
    return st * 8 * nt * (2 * xrow + 64) + (st * gw * 16 * (wrow + mrow) if cfg.get("QF_WSMEM") else 0) + \
        (4 * nt * 32 * gw * 4 if cfg["QF_CHAINS"] > 1 and not cfg.get("QF_KSPLIT") else 0)


def check_config(cfg: dict) -> None:
    """The kernel's static_asserts and limits, on the host."""
    bad = [f"unknown tunable {k}" for k in sorted(set(cfg) - set(KEYS))]
    c = cfg.get("QF_CHAINS", 1)
    if cfg.get("QF_TYPE", 12) not in TYPES:
        bad.append(f"QF_TYPE {cfg['QF_TYPE']} (it has {', '.join(str(x) for x in TYPES)})")
        cfg = {**cfg, "QF_TYPE": 12}
    if c < 1 or cfg.get("QF_WARPS", 4) % c:
        bad.append("QF_WARPS a multiple of QF_CHAINS (a tile's chains share a qf_mv block)")
    if not 1 <= cfg.get("QF_WARPS", 4) <= 32 or not 1 <= cfg.get("QF_AHEAD", 1) <= 3:
        bad.append("QF_WARPS 1..32, QF_AHEAD 1..3")
    if is_gemm(cfg):
        if not 2 <= cfg["QF_STAGES"] <= 4 or cfg["QF_NT"] not in (1, 2, 4, 8) or not 1 <= cfg["QF_GWARPS"] <= 16:
            bad.append("QF_STAGES 2..4, QF_NT 1, 2, 4 or 8, QF_GWARPS 1..16")
        if cfg.get("QF_KSPLIT", 0) not in (0, 1) or cfg.get("QF_WSMEM", 0) not in (0, 1):
            bad.append("QF_KSPLIT and QF_WSMEM 0 or 1")
        elif smem_bytes(cfg) > SMEM_MAX:
            bad.append(f"shared memory {smem_bytes(cfg)} > {SMEM_MAX}")
    if bad:
        raise MemraError(f"qf {cfg}: " + "; ".join(bad))


def check_shape(t: int, N: int, K: int, nb: int, glu: bool) -> None:
    """The host contract: Q4_K or Q6_K, K a positive multiple of 256 chains(N, K, glu), 16-row weight tiles (N a
    multiple of 16, glu of 8), nb >= 1, the int32 arguments in range."""
    bad = []
    if t not in TYPES:
        bad.append(f"no qf kernel for {_name(t)} weights (it has {', '.join(_name(x) for x in TYPES)})")
    c = chains(N, K, glu)
    if K <= 0 or K % (256 * c):
        bad.append(f"K = {K} not a positive multiple of {256 * c}")
    if N <= 0 or N % (8 if glu else 16):
        bad.append(f"N = {N} not a positive multiple of {8 if glu else 16}")
    if nb < 1:
        bad.append(f"nb = {nb} < 1")
    if max(2 * N, K, nb) >= 2 ** 31 or nb * max(K, 2 * N) * c >= 2 ** 31:
        bad.append("the int32 arguments overflow")
    if bad:
        raise MemraError(f"qf{' glu' if glu else ''}: " + "; ".join(bad))


def supports(t: int, N: int, K: int, glu: bool) -> bool:
    """Whether a plan's generated rows (MEMRA_DECODE=qf) take qf for a weight of type t with N output rows (glu:
    2N weight rows) of K: a function of the weight alone, never of the row count."""
    try:
        check_shape(t, N, K, 1, glu)
    except MemraError:
        return False
    return True


def launch_shape(cfg: dict, N: int, nb: int, glu: bool):
    """(entry, grid, block, smem bytes, ws floats, cnt ints) of a launch (N output rows)."""
    check_config(cfg)
    tiles = (2 * N if glu else N) // 16
    c = cfg["QF_CHAINS"]
    sfx = "_glu" if glu else ""
    if not is_gemm(cfg):
        if nb > MV_ROWS:
            raise MemraError(f"qf_mv takes at most {MV_ROWS} rows, got {nb}")
        w = cfg["QF_WARPS"]
        return "qf_mv" + sfx, (-(-tiles * c // w), 1, 1), (32 * w, 1, 1), 0, 0, 0
    gw, nt, ks = cfg["QF_GWARPS"], cfg["QF_NT"], cfg.get("QF_KSPLIT", 0)
    grid = (-(-tiles // gw), -(-nb // (8 * nt)), c if ks else 1)
    split = ks and c > 1
    return ("qf_gemm" + sfx, grid, (32 * gw, 1, 1), smem_bytes(cfg),
            c * nb * (2 * N if glu else N) if split else 0, grid[0] * grid[1] if split else 0)


def workspace(N: int, K: int, nb: int, glu: bool, config: dict | None = None, t: int = 12) -> tuple[int, int]:
    """(ws floats, cnt ints) a launch over nb rows needs (0, 0 without the chains split across blocks)."""
    return launch_shape(launch_config(nb, N, K, glu, config, t), N, nb, glu)[4:]


def _module(g, cfg: dict, canary: int = 0):
    return g.module(KERNEL_FILE, {**cfg, **({"MEMRA_CANARY": canary} if canary else {})})


def qf(g, w, y, *, xh, xs2, nb: int, residual=None, glu: str | None = None, config: dict | None = None,
       ws=None, cnt=None, canary: int = 0, pdl: bool = False) -> None:
    """y[b, :] (+)= W x[b, :] for b < nb on to_qf's activations (xh: uint16 f16 bits in qf order, xs2: the
    sums), qf_mv up to MV_ROWS rows else qf_gemm (or as `config` names); ws / cnt: float32 / int32 device
    arrays of workspace()'s sizes (cnt zero before the first launch; each launch leaves it zero)."""
    MV.check_glu("qf", glu, w.rows)
    if glu and residual is not None:
        raise MemraError("qf: the glu entry takes no residual")
    N = w.rows // 2 if glu else w.rows
    check_shape(w.ggml_type, N, w.K, nb, bool(glu))
    _launch(g, w, y, launch_config(nb, N, w.K, bool(glu), config, w.ggml_type), xh, xs2, nb, residual, glu, ws, cnt,
            canary, pdl)


def _launch(g, w, y, cfg: dict, xh, xs2, nb: int, residual, glu, ws, cnt, canary: int = 0, pdl: bool = False):
    """One launch at the tunables cfg (qf's, after its checks of the weight and shape): the operands' checks."""
    N, K = (w.rows // 2 if glu else w.rows), w.K
    entry, grid, block, smem, n_ws, n_cnt = launch_shape(cfg, N, nb, bool(glu))
    if xh.dtype != np.uint16 or xh.size < nb * K or xs2.dtype != np.float32 or xs2.size < nb * K // 16:
        raise MemraError(f"qf: xh must be uint16 with >= {nb}x{K} values and xs2 float32 with >= {nb}x{K // 16}")
    if y.dtype != np.float32 or y.size < nb * N or (residual is not None and residual.size < nb * N):
        raise MemraError(f"qf: y (and residual) must be f32 with >= {nb}x{N} values")
    if n_ws and (ws is None or cnt is None or ws.dtype != np.float32 or ws.size < n_ws or cnt.dtype != np.int32
                 or cnt.size < n_cnt):
        raise MemraError(f"qf: this launch splits its chains across blocks: ws float32 >= {n_ws} and cnt int32 >= "
                         f"{n_cnt} values (zero) needed")
    k = _module(g, cfg, canary).kernel(entry)
    if entry.startswith("qf_mv"):
        args = ((w.bulk, w.meta, xh, xs2, y, np.int32(N), np.int32(K), np.int32(nb), np.int32(MV.ACTS[glu]))
                if glu else (w.bulk, w.meta, xh, xs2, y, residual if residual is not None else _NULL,
                             np.int32(N), np.int32(K), np.int32(nb)))
    else:
        wsp = ws if n_ws else _NULL
        cp = cnt if n_ws else _NULL
        args = ((w.bulk, w.meta, xh, xs2, y, wsp, cp, np.int32(N), np.int32(K), np.int32(nb), np.int32(MV.ACTS[glu]))
                if glu else (w.bulk, w.meta, xh, xs2, y, residual if residual is not None else _NULL, wsp, cp,
                             np.int32(N), np.int32(K), np.int32(nb)))
    g.launch(k, grid, block, args, shmem=smem, pdl=pdl)


def to_qf(g, x, xh, xs2, nb: int, K: int, pdl: bool = False, canary: int = 0) -> None:
    """xh, xs2 = the qf activations of x (nb rows of K, K a multiple of 256): `producer` on the device."""
    if x.dtype != np.float32 or xh.dtype != np.uint16 or xs2.dtype != np.float32:
        raise MemraError("to_qf: x must be f32, xh uint16 and xs2 f32")
    if K <= 0 or K % 256 or nb < 1 or nb * K >= 2 ** 31:
        raise MemraError(f"to_qf: K = {K} must be a positive multiple of 256 and nb = {nb} >= 1 (nb K < 2^31)")
    if x.size < nb * K or xh.size < nb * K or xs2.size < nb * K // 16:
        raise MemraError(f"to_qf: x and xh need >= {nb}x{K} values, xs2 >= {nb}x{K // 16}")
    m = g.module(KERNEL_FILE, {"MEMRA_CANARY": canary} if canary else {})
    g.launch(m.kernel("to_qf"), (-(-nb * K // 256 // 8), 1, 1), (TO_QF_THREADS, 1, 1),
             (x, xh, xs2, np.int32(nb), np.int32(K)), pdl=pdl)


# -- the host side: to_qf's replay and the float64 reference ------------------------------

QF_ORDER = (0, 2, 1, 3, 4, 6, 5, 7)   # each 8 activations' places in xh


def tf32(a: np.ndarray) -> np.ndarray:
    """f32 rounded to tf32 (to nearest, ties away from zero: cvt.rna.tf32.f32), as f32."""
    b = np.ascontiguousarray(a, np.float32).view(np.uint32)
    return ((b + np.uint32(0x1000)) & np.uint32(0xFFFFE000)).view(np.float32)


def producer(x: np.ndarray, canary: int = 0):
    """to_qf on the host, bit for bit: (xh [nb, K] uint16, f16 of x in qf order; xs2 [nb, K / 16] f32, per
    superblock [tig 4][hi_t, hi_t+4, lo_t, lo_t+4]; x16 [nb, K] float16 in natural order; S2 [nb, K / 32]
    float64 = hi + lo, what the kernel's mins see). S2 of a 32-element sub-block: each 8 f16 values summed in
    f32 in increasing k, then the four as (s0 + s1) + (s2 + s3); hi = tf32(S2), lo = tf32(S2 - hi).
    canary 3: the four as (s0 + s2) + (s1 + s3) (the kernel's MEMRA_CANARY 3)."""
    x = np.asarray(x, np.float32)
    nb, K = x.shape
    with np.errstate(over="ignore"):
        x16 = x.astype(np.float16)
    xh = np.ascontiguousarray(x16.reshape(nb, K // 8, 8)[:, :, list(QF_ORDER)].reshape(nb, K)).view(np.uint16)
    v = x16.astype(np.float32).reshape(nb, K // 8, 8)
    p = np.zeros((nb, K // 8), np.float32)
    with np.errstate(invalid="ignore", over="ignore"):
        for i in range(8):
            p = (p + v[:, :, i]).astype(np.float32)
        p = p.reshape(nb, K // 32, 4)
        a, b = ((0, 1), (2, 3)) if canary != 3 else ((0, 2), (1, 3))
        s2 = ((p[:, :, a[0]] + p[:, :, a[1]]).astype(np.float32) +
              (p[:, :, b[0]] + p[:, :, b[1]]).astype(np.float32)).astype(np.float32)
        hi = tf32(s2)
        lo = tf32((s2 - hi).astype(np.float32))
    h, lw = hi.reshape(nb, K // 256, 8), lo.reshape(nb, K // 256, 8)
    t = np.arange(4)
    xs2 = np.stack([h[:, :, t], h[:, :, t + 4], lw[:, :, t], lw[:, :, t + 4]], axis=-1).astype(np.float32)
    return xh, np.ascontiguousarray(xs2).reshape(nb, K // 16), x16, hi.astype(np.float64) + lo


def reference(raw: np.ndarray, x16: np.ndarray, s2: np.ndarray, t: int = 12) -> np.ndarray:
    """float64 outputs [nb, rows] of GGUF rows `raw` of type t on the activations x16 [nb, K] (f16) with sums s2
    [nb, K / 32] (producer's): Q4_K per 32-sub-block d sc S1 - dmin m S2, S1 = sum q x exact; Q6_K per 16-sub-block
    d sc sum (q - 32) x."""
    from memra.model import quants as Q

    rows = raw.shape[0]
    nb, K = x16.shape
    if t == 14:
        q, dsc, _ = Q._q6_k(np.ascontiguousarray(raw).reshape(rows * (K // 256), 210))
        q = q.reshape(rows, K // 16, 16).astype(np.float64)
        x = x16.astype(np.float64).reshape(nb, K // 16, 16)
        return (np.einsum("nsk,bsk->bns", q, x) * dsc.reshape(rows, K // 16).astype(np.float64)[None]).sum(-1)
    q, dsc, mneg = Q._q4_k(np.ascontiguousarray(raw).reshape(rows * (K // 256), 144))
    q = q.reshape(rows, K // 32, 32).astype(np.float64)
    x = x16.astype(np.float64).reshape(nb, K // 32, 32)
    s1 = np.einsum("nsk,bsk->bns", q, x)
    return (s1 * dsc.reshape(rows, K // 32).astype(np.float64)[None]
            + mneg.reshape(rows, K // 32).astype(np.float64)[None] * s2[:, None, :]).sum(-1)


# -- kernel-check -----------------------------------------------------------------------

# The oracle's bound, max |got - ref| / max |ref|: the reference is the float64 value of the very operands the
# kernel multiplies (sc q or q - 32 exact in f16, x f16, m and S2's hi / lo exact in tf32, d sc exact in f32),
# whose products are exact in f32, so all the kernel adds is its f32 accumulation — inside a superblock's mma chain
# (16 k16 steps) or a sub-block's one mma, the fmas of its folds, the chains' sums: measured 2e-7 .. 6e-7 of the
# largest output on the 8B's Q4_K shapes (research/2026-12-07-session54/q2), 0.9e-7 .. 6.3e-7 on Q6_K's checks
# (research/2026-12-07-session56). 1e-4 sits 100x above that and far below what the checks exist to catch: one
# dropped k16 step moves an output by ~sqrt(16 / K) of its size (>= 3 % at K = 14336), a wrong row all of it.
TOL = 1e-4
# (N, K, nb, glu, residual aliasing y): one row, a partial n8 tile, qf_mv's 8, qf_gemm with and without the
# chains split (2 and 4 chains, a partial 64-row column tile), glu on both activations, a residual
_CHECK = ((64, 1024, 1, None, False), (64, 1024, 3, "silu", False), (48, 2048, 8, None, True),
          (64, 1024, 9, "gelu", False), (128, 1024, 17, None, False), (64, 1536, 40, None, True),
          (128, 1024, 64, "silu", False), (96, 1024, 70, None, False))
# qf_gemm configurations (over default_config's) whose bits kernel-check compares with qf_mv's / the built-in's
_GEMM = ({"QF_GWARPS": 4, "QF_NT": 1, "QF_STAGES": 2, "QF_KSPLIT": 0, "QF_WSMEM": 0},
         {"QF_GWARPS": 4, "QF_NT": 8, "QF_STAGES": 3, "QF_KSPLIT": 0, "QF_WSMEM": 1},
         {"QF_GWARPS": 8, "QF_NT": 4, "QF_STAGES": 2, "QF_KSPLIT": 1, "QF_WSMEM": 1},
         {"QF_GWARPS": 2, "QF_NT": 2, "QF_STAGES": 4, "QF_KSPLIT": 1, "QF_WSMEM": 0})
_MV = ({"QF_AHEAD": 2}, {"QF_AHEAD": 3})


def compile_variants() -> list[tuple[str, dict]]:
    out = [(KERNEL_FILE, {})]
    for t in TYPES:
        for glu, K in ((False, 1024), (False, 512), (False, 256), (True, 1024)):
            for nb in (1, 64):
                out.append((KERNEL_FILE, launch_config(nb, 64, K, glu, None, t)))
            for c in _GEMM + _MV:
                out.append((KERNEL_FILE, launch_config(64 if "QF_NT" in c else 1, 64, K, glu, c, t)))
    out += [(KERNEL_FILE, {**launch_config(1, 64, 1024, False), "MEMRA_CANARY": 1}),
            (KERNEL_FILE, {**launch_config(1, 64, 1024, False, None, 14), "MEMRA_CANARY": 1}),
            (KERNEL_FILE, {**launch_config(64, 64, 1024, False, _GEMM[2]), "MEMRA_CANARY": 2}),
            (KERNEL_FILE, {"MEMRA_CANARY": 3})]
    seen, uniq = set(), []
    for f, d in out:
        k = tuple(sorted(d.items()))
        if k not in seen:
            seen.add(k)
            uniq.append((f, d))
    return uniq


def _x(rng, nb: int, K: int) -> np.ndarray:
    return (rng.standard_normal((nb, K)) * rng.uniform(0.5, 4)).astype(np.float32)


class _Inputs:
    """A weight and nb activation rows on the device as the engine holds them (to_qf's outputs from the host
    replay, so the matmul checks do not depend on to_qf), and the launch's scratch."""

    def __init__(self, g, rng, raw: np.ndarray, nb: int, glu: str | None, t: int = 12):
        self.g, self.raw, self.nb, self.glu, self.t = g, raw, nb, glu, t
        self.w = MV.upload_weight(g, raw, t)
        self.K = self.w.K
        self.N = raw.shape[0] // 2 if glu else raw.shape[0]
        self.xh_h, self.xs2_h, self.x16, self.s2 = producer(_x(rng, nb, self.K))
        self.xh, self.xs2 = g.to_device(self.xh_h.reshape(-1)), g.to_device(self.xs2_h.reshape(-1))
        self.ws = g.empty(max(1, 4 * nb * raw.shape[0]), np.float32)
        self.cnt = g.to_device(np.zeros(4096, np.int32))

    def run(self, config=None, canary: int = 0, rows=None, residual=None, glu="same", plain=False):
        """One launch over rows r0..r1 - 1 (default all) on a poisoned y (or the residual aliased as y); plain: the
        plain kernel over every weight row (a gate+up weight's in the glu kernel's chains)."""
        g, K = self.g, self.K
        r0, r1 = rows or (0, self.nb)
        n = r1 - r0
        act = None if plain else self.glu if glu == "same" else glu
        out = self.raw.shape[0] if plain else self.N
        y = residual if residual is not None else g.empty((n, out), np.float32)
        if residual is None:
            y.poison()
        xh, xs2 = self.xh.view(shape=(n * K,), offset=2 * r0 * K), self.xs2.view(shape=(n * K // 16,),
                                                                                offset=4 * r0 * K // 16)
        if plain and self.glu:   # gate and up through the plain kernel at the glu launch's configuration: its oracle
            _launch(g, self.w, y, launch_config(n, self.N, K, True, config, self.t), xh, xs2, n, None, None, self.ws,
                    self.cnt, canary)
        else:
            qf(g, self.w, y, xh=xh, xs2=xs2, nb=n, residual=residual, glu=act, config=config, ws=self.ws,
               cnt=self.cnt, canary=canary)
        g.sync()
        return y.numpy().reshape(n, out)


def against_ref(g, rng, name: str, raw: np.ndarray, nb: int, glu: str | None, alias: bool, config=None,
                canary: int = 0, t: int = 12):
    """The kernel on GGUF rows `raw` (2N rows for glu) and nb random activation rows: the plain kernel over every
    row against the float64 reference (TOL); its first and last rows launched alone bit for bit; then glu: the
    glu kernel against act_mul of the plain gate and up outputs bit for bit (and the float64 reference), or a
    residual aliased as y: fl(plain + r) bit for bit."""
    from memra.gpu.compare import Outcome, compare, epilogue, rows_alone
    from memra.gpu.ops import act as ACT

    I = _Inputs(g, rng, raw, nb, glu, t)
    N = I.N
    ref = reference(raw, I.x16, I.s2, t)
    plain = I.run(config, canary, plain=True)
    o = compare(name + " (plain)", plain, ref, TOL, kind="max")
    if not o.ok:
        return o
    alone = rows_alone(name, plain, lambda r0, n: I.run(config, canary, rows=(r0, r0 + n), plain=True), o.err)
    if alone is not None:
        return alone
    if not glu and not alias:
        return Outcome(name, True, o.detail + "; rows alone = in the batch bit for bit", o.err)
    if glu:
        want = ACT.act_mul_of(g, plain, MV.ACT_MUL[glu])
        got = I.run(config, canary)
        ref2 = MV.glu_ref(ref, glu)
        what = "act_mul of the plain gate and up outputs"
    else:
        res = rng.standard_normal((nb, N)).astype(np.float32)
        want = plain + res                                                   # float32: one rounding
        got = I.run(config, canary, residual=g.to_device(res))
        ref2 = ref + res.astype(np.float64)
        what = "fl(plain + residual)"
    return epilogue(name, got, ref2, want, what, TOL)


def check_case(g, rng, N: int, K: int, nb: int, glu: str | None, alias: bool, config=None, canary: int = 0,
               t: int = 12):
    raw = MV.random_weight(t, 2 * N if glu else N, K, rng)
    name = (f"qf {_name(t)} nb={nb} {N}x{K} chains={chains(N, K, bool(glu))}{' glu-' + glu if glu else ''}"
            f"{' +res(alias y)' if alias else ''}{' ' + ','.join(f'{k}={v}' for k, v in config.items()) if config else ''}")
    return against_ref(g, rng, name, raw, nb, glu, alias, config, canary, t)


def check_kernels(g, rng, N: int, K: int, glu: str | None, nb: int = 8, canary: int = 0, t: int = 12):
    """qf_gemm at every configuration of _GEMM and qf_mv at every one of _MV give the bits of qf_mv's built-in
    configuration (which check_case holds to the reference) on the same weight and activations, and every row of
    qf_gemm's launch those of that row launched alone on qf_mv (nb <= 8: qf_mv takes them all at once)."""
    from memra.gpu.compare import Outcome, bits_differ

    I = _Inputs(g, rng, MV.random_weight(t, 2 * N if glu else N, K, rng), nb, glu, t)
    name = f"qf {_name(t)} nb={nb} {N}x{K} chains={chains(N, K, bool(glu))}{' glu-' + glu if glu else ''} kernels"
    base = I.run()
    if not np.all(np.isfinite(base)):
        return Outcome(name, False, "qf_mv's built-in configuration left outputs unwritten")
    for c in _GEMM + _MV:
        bad = bits_differ(I.run(c, canary), base)
        if bad:
            return Outcome(name, False, f"{c}: {bad} of {base.size} values differ from qf_mv's bits")
    return Outcome(name, True, f"qf_gemm at {len(_GEMM)} and qf_mv at {len(_MV) + 1} configurations: the same bits",
                   0.0)


def check_to_qf(g, rng, nb: int, K: int, canary: int = 0):
    """to_qf over nb rows of K (values past f16's range and in its subnormal range, exact halfway cases) against
    its host replay (producer) bit for bit, xh and xs2."""
    from memra.gpu.compare import Outcome

    x = _x(rng, nb, K)
    flat = x.reshape(-1)
    m = min(flat.size, 64)
    flat[:m] *= np.float32(2.0) ** rng.integers(-30, 18, m).astype(np.float32)
    if flat.size > 80:
        flat[m:m + 6] = np.array([1 + 2 ** -11, 1 + 3 * 2 ** -11, -(2 + 2 ** -10), 65520.0, 2 ** -25, -3 * 2 ** -25],
                                 np.float32)
    if flat.size >= 256:   # a sub-block whose S2 depends on the sum order (plant)
        flat[96:128] = plant()
    xh_h, xs2_h, _, _ = producer(x)
    xh, xs2 = g.empty(nb * K, np.uint16), g.empty(nb * K // 16, np.float32)
    xh.poison()
    xs2.poison()
    to_qf(g, g.to_device(x), xh, xs2, nb, K, canary=canary)
    g.sync()
    bx = int(np.count_nonzero(xh.numpy() != xh_h.reshape(-1)))
    got, want = xs2.numpy(), xs2_h.reshape(-1)
    # bit for bit, a NaN against a NaN excepted (a sub-block holding f16 infinities of both signs, or an infinite S2's
    # lo = inf - inf: the host's NaN carries another sign / payload than the device's canonical one)
    bs = int(np.count_nonzero((got.view(np.uint32) != want.view(np.uint32)) & ~(np.isnan(got) & np.isnan(want))))
    ok = bx == 0 and bs == 0
    return Outcome(f"to_qf nb={nb} K={K}{' canary ' + str(canary) if canary else ''}", ok,
                   "xh and xs2 = the host replay bit for bit" if ok else
                   f"{bx} of {nb * K} xh and {bs} of {nb * K // 16} xs2 values differ from the host replay",
                   0.0 if ok else np.inf)


def plant() -> np.ndarray:
    """32 activations whose S2 depends on to_qf's order: partial sums 2^18, 2^-10, -2^18, 2^-10 give 0 as (s0 + s1) +
    (s2 + s3) and 2^-9 as (s0 + s2) + (s1 + s3)."""
    return np.repeat(np.array([32768.0, 2.0 ** -13, -32768.0, 2.0 ** -13], np.float32), 8)


def checks(g, rng: np.random.Generator) -> Iterator:
    for nb, K in ((1, 256), (3, 4096), (64, 14336)):
        yield check_to_qf(g, rng, nb, K)
    for t in TYPES:
        for N, K, nb, glu, alias in _CHECK:
            yield check_case(g, rng, N, K, nb, glu, alias, t=t)
        for N, K, glu in ((64, 1024, None), (48, 512, None), (32, 1024, "silu"), (64, 2048, None)):
            yield check_kernels(g, rng, N, K, glu, nb=7, t=t)
        # an 8B layer's K at qf_gemm's 64 rows (the down's 56 superblocks in 4 chains across blocks)
        yield check_case(g, rng, 64, 14336, 64, None, True, t=t)
        yield check_case(g, rng, 64, 4096, 64, "silu", False, t=t)
    # Q6_K rows of an odd superblock count (the meta windows at both offsets within one row)
    yield check_case(g, rng, 48, 768, 5, None, False, t=14)
    yield check_case(g, rng, 48, 768, 24, None, True, t=14)


def canaries(g, rng: np.random.Generator) -> Iterator:
    yield check_case(g, rng, 64, 1024, 3, None, alias=False, canary=1)
    yield check_case(g, rng, 64, 1024, 3, None, alias=False, canary=1, t=14)
    yield check_kernels(g, rng, 64, 1024, None, nb=7, canary=2)
    yield check_to_qf(g, rng, 3, 512, canary=3)


# -- the launch set (memra.tune.launches: the engine's own launches, run by kernel-check) ----------

_LAUNCH_N = 128   # output rows checked of a larger weight


def launch_cases(L, ctx) -> list[dict]:
    """A plan launch of op to_qf (the module without tunables, one case per row bucket and K) or qf: the module
    the launcher builds (launch_config with the launch's tunables), the exact batch, K and whether the output
    aliases the residual."""
    if L.op == "to_qf":
        K, b = int(L.shape["n"]), launch_bucket(L.rows)
        return [{"file": KERNEL_FILE, "entry": "to_qf", "defines": {}, "bucket": b, "tag": f"K{K}",
                 "params": {"K": K, "rows": b}}]
    glu, nb, K = L.args.get("glu"), int(L.rows), int(L.shape["cols"])
    N, t = int(L.shape["rows"]) // (2 if glu else 1), MV.type_id(L.shape["type"])
    cfg = launch_config(nb, N, K, bool(glu), L.config, t)
    entry = launch_shape(cfg, N, nb, bool(glu))[0]
    res = bool(L.args.get("res"))
    return [{"file": KERNEL_FILE, "entry": entry, "defines": cfg, "bucket": nb,
             "tag": f"K{K}" + (" res=y" if res else ""),
             "params": {"type": t, "N": N, "K": K, "nb": nb, "glu": glu, "res": res}}]


def check_launch(g, rng, case):
    """to_qf at the case's rows and K against its host replay; qf at the launch's module, batch, K (and so chain
    count) and residual aliasing on a random weight (at most _LAUNCH_N output rows), as against_ref."""
    p = case["params"]
    if case["entry"] == "to_qf":
        return check_to_qf(g, rng, p["rows"], p["K"])
    nb, K, glu, alias = p["nb"], p["K"], p["glu"], p["res"]
    cfg = {k: v for k, v in case["defines"].items() if k in KEYS}
    N, t = min(p["N"], _LAUNCH_N), p["type"]
    raw = MV.random_weight(t, 2 * N if glu else N, K, rng)
    name = f"{case['entry']} {_name(t)} nb={nb} {N}x{K}{' res=y' if alias else ''} {cfg}"
    return against_ref(g, rng, name, raw, nb, glu, alias, cfg, t=t)


# -- tuning (memra/tune/measure.py's hooks; tune/campaigns/h200-qf.toml) ---------------------------------------

VARIANT = "qf"
TUNE_VARIANTS = {"qf": (VARIANT,), "qf_glu": (VARIANT,)}
_TUNE_ROWS = 128   # output rows a tune check holds to the float64 reference (every output: the built-in's bits)
_INPUTS: dict[tuple, tuple] = {}    # (nb, glu) -> (the weight they were made for, the activations and references)


def _tune_args(kernel: str, variant: str, config: dict, shape: dict):
    """(type id, glu, N, K, nb, launch config) of a tune job, or MemraError: an unknown kernel, variant or tunable,
    a chain count or type not the weight's, a shape or configuration the kernel refuses (before any compile)."""
    if variant not in TUNE_VARIANTS.get(kernel, ()):
        raise MemraError(f"qf tune: unknown kernel/variant {kernel}/{variant} (it measures "
                         f"{', '.join(k + '/' + VARIANT for k in TUNE_VARIANTS)})")
    config = dict(config or {})
    bad = sorted(set(config) - set(KEYS))
    if bad:
        raise MemraError(f"qf tune: unknown tunables {bad} (known: {', '.join(KEYS)})")
    t, glu = MV.type_id(shape["type"]), kernel == "qf_glu"
    rows, K, nb = int(shape["rows"]), int(shape["cols"]), int(shape.get("batch", 1))
    if glu and rows % 2:
        raise MemraError(f"qf tune: a qf_glu weight stacks gate and up (an even row count, got {rows})")
    N = rows // 2 if glu else rows
    check_shape(t, N, K, nb, glu)
    cfg = launch_config(nb, N, K, glu, config, t)
    launch_shape(cfg, N, nb, glu)   # check_config, and qf_mv's rows
    return t, glu, N, K, nb, cfg


class _TuneCase:
    """The shape's weight in the planes layout (copies rotating past the L2), nb rows of random activations as
    to_qf leaves them (its host replay), the job's configuration, launched as the planner launches a table entry's.
    The references: the float64 value of the same arithmetic for the first _TUNE_ROWS outputs (act(gate) * up for
    glu), and the built-in configuration's launch for every output's bits (the outputs do not depend on the
    configuration, and kernel-check holds the built-in one to that float64 value)."""

    def __init__(self, g, t, glu, N, K, nb, config, rng, rotate_bytes):
        self.g, self.t, self.glu, self.N, self.K, self.nb, self.config = g, t, glu, N, K, nb, config
        # (no float64 copy of the weight: the references take _TUNE_ROWS of its GGUF rows)
        self.ws, _, raw = MV._shape_weights(g, t, 2 * N if glu else N, K, rng, rotate_bytes, raw=True, dequant=False)
        self.sets = len(self.ws)
        # the job's launches and the built-in reference's share one workspace
        n_ws, n_cnt = (max(a, b) for a, b in zip(workspace(N, K, nb, glu, config, t),
                                                 workspace(N, K, nb, glu, None, t)))
        self.wsp, self.cnt = g.empty(max(1, n_ws), np.float32), g.to_device(np.zeros(max(1, n_cnt), np.int32))
        hit = _INPUTS.get((nb, glu))
        if hit is None or hit[0] is not self.ws[0]:   # the weight object itself: ids are reused
            hit = _INPUTS[(nb, glu)] = (self.ws[0], self._inputs(raw, rng))
        self.xh, self.xs2, self.ref, self.bits = hit[1]
        self.y = g.empty((nb, N), np.float32)
        self.bytes = self.ws[0].nbytes + nb * (2 * K + (K // 4 if t == 12 else 0) + 4 * N)

    def _run(self, w, y, config) -> None:
        qf(self.g, w, y, xh=self.xh, xs2=self.xs2, nb=self.nb, glu="silu" if self.glu else None, config=config,
           ws=self.wsp, cnt=self.cnt)

    def _inputs(self, raw: np.ndarray, rng):
        g, N = self.g, self.N
        xh_h, xs2_h, x16, s2 = producer(_x(rng, self.nb, self.K))
        self.xh, self.xs2 = g.to_device(xh_h.reshape(-1)), g.to_device(xs2_h.reshape(-1))
        R = min(N, _TUNE_ROWS)
        ref = reference(raw[np.r_[0:R, N:N + R]] if self.glu else raw[:R], x16, s2, self.t)
        if self.glu:
            ref = MV.glu_ref(ref, "silu")
        yb = g.empty((self.nb, N), np.float32)
        yb.poison()
        self._run(self.ws[0], yb, None)
        g.sync()
        return self.xh, self.xs2, ref, yb.numpy().view(np.uint32).copy()

    def launch(self, i: int) -> None:
        self._run(self.ws[i % self.sets], self.y, self.config)

    def check(self):
        """One launch on a poisoned y: its first _TUNE_ROWS outputs against the float64 reference at TOL, then every
        output against the built-in configuration's bits."""
        from memra.gpu.compare import tune_check

        self.y.poison()
        self.launch(0)
        self.g.sync()
        return tune_check("qf", self.y.numpy(), self.ref, self.bits, TOL)


def tune_case(g, kernel: str, variant: str, config: dict, shape: dict, rng, rotate_bytes: int):
    t, glu, N, K, nb, _ = _tune_args(kernel, variant, config, shape)
    return _TuneCase(g, t, glu, N, K, nb, dict(config or {}), rng, rotate_bytes)


def is_builtin(kernel: str, variant: str, config: dict, shape: dict) -> bool:
    """Whether a tune job's configuration launches as the built-in one (default_config at its rows); False for a
    configuration the hooks refuse."""
    try:
        t, glu, N, K, nb, cfg = _tune_args(kernel, variant, config, shape)
    except MemraError:
        return False
    return cfg == launch_config(nb, N, K, glu, None, t)


def tune_modules(kernel: str, variant: str, config: dict, shape: dict) -> list[tuple[str, dict]]:
    """The module a tune job loads, for the campaign's parallel precompile (a refused configuration raises: never
    compiled, its job records why)."""
    return [(KERNEL_FILE, _tune_args(kernel, variant, config, shape)[5])]
