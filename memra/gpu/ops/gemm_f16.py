"""Quantized products on f16 tensor cores: the weight tile dequantized to f16 in shared memory, the
activations in f16, every output one float32 accumulator over the k16 steps in increasing k, so a
row's bits depend neither on the batch, the rows beside it nor the configuration. Two kernels with
the same entries, arguments and bits: kernels/gemm_f16_wg.cu (sm_90a: a producer warpgroup
dequantizes into 128-byte-swizzled shared memory, two consumer warpgroups run wgmma m64nNk16; the
engine's, WG_* tunables) and kernels/gemm_f16.cu (mma.sync m16n8k16, any sm_80+; GF_* tunables,
and to_f16). Measured on an H100 (research/2026-12-06-session43/f, the 8B's shapes at 512 rows):
wgmma 1.7-2.6x gemm_f16.cu's mma.sync and the int8 prompt tile, every configuration of both the same
bits.

    to_f16(g, x, xh, n)                                 # xh = f16(x), round to nearest even
    gemm_f16(g, w, y, xh=xh, nb=nb)                     # y[b, :] = W xh[b, :], b < nb
        residual=r   y = fl(r + W x) (r may be y itself)
        glu="silu"|"gelu"   W holds [gate; up] (2N rows): y = fl(act(gate x) * (up x))

Weight types: every quantized type of kernels/qtypes.cuh (TYPES), in memra.gpu.ops.matvec's planes
layout. A configuration with WG_* keys is gemm_f16_wg.cu's: WG_BN activation rows a block (the
wgmma N: 64, 128, 256), WG_MT m64 tiles a consumer (BM = 128 WG_MT), WG_STAGES, WG_INFLIGHT,
WG_PREFETCH; 384 threads. The built-in one is by the weight alone (default_config): WG_BN 256 with
WG_INFLIGHT 0 (WG_WIDE) for weights of at least WG_WIDE_ROWS rows, WG_BN 128 (WG) below, where 256
activation rows a block would leave half the SMs idle at a 512-row chunk (4,096-row weights: 64
blocks). One with GF_* keys is gemm_f16.cu's: GF_WM x GF_WN warps, each GF_TM m16 weight tiles x
GF_TN n8 activation tiles (BM = 16 GF_TM GF_WM weight rows, BN = 8 GF_TN GF_WN activation rows, NT
= 32 GF_WM GF_WN threads), GF_OVERLAP / GF_OVL0 (the next stage's dequant between the mma); MMA is
its 2 x 4 warps of 4 x 4 tiles (BM 128, BN 128), WIDE its GF_TM 8 (BM 256).

Where the engine uses it: the prompt rows of MEMRA_ATTN=hybrid (the default path) take it on the
weights `supports` accepts (a function of the weight alone), after one to_f16 launch per source
activation (memra.gpu.plan; MEMRA_PROMPT_GEMM=tile, the rollback, puts them back on
kernels/gemm_tile.cu's chain order). On another arch than sm_90a the built-in configuration runs on
gemm_f16.cu (MMA: the same bits). Its arithmetic is neither mv_q8's nor the chain's: f16
activations (11 significant bits each) and f16-rounded weights (~2^-11 relative), so a prompt row's
bits differ from the tile's as the tile's differ from a decode row's.

The oracle (kernel-check): the float64 product of the f16-rounded weights (memra.model.quants'
dequantized values rounded to float16) and the f16 activations, at TOL of the largest |output|;
and bit for bit: rows 0..c-1 (and the last rows) of an nb-row launch equal a launch over those
rows alone (chunk and batch invariance), every configuration the built-in one's bits, glu outputs
act_mul (kernels/act.cu) of the plain kernel's gate and up outputs, a residual's fl(plain + r),
to_f16 numpy's astype(float16).

The tune hooks (memra/tune/measure.py): tune_case, is_builtin, tune_modules for kernels gemm_f16 /
gemm_f16_glu, variant "f16" (the planner's table lookup: a table entry's configuration is the
launch's), WG_* or GF_* configurations laid over the weight's default_config; a job's check holds
it to the float64 product and to the built-in configuration's bits (tune/campaigns/h200-gemm-f16.toml).
"""

from __future__ import annotations

from math import lcm
from typing import Iterator

import numpy as np

from memra.errors import MemraError
from memra.gpu.ops import launch_bucket, tile_shape_problems
from memra.gpu.ops import matvec as MV

# -- the launch and host contract (kernels/gemm_f16.cu's header) --------------------------

KERNEL_FILE = "gemm_f16.cu"       # mma.sync, and to_f16
WG_FILE = "gemm_f16_wg.cu"        # wgmma (sm_90a)
WG_ARCH = "sm_90a"
TYPES = (2, 3, 6, 7, 8, 12, 13, 14, 23)   # Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 Q4_K Q5_K Q6_K IQ4_XS
KEYS = ("GF_WM", "GF_WN", "GF_TM", "GF_TN", "GF_OVERLAP", "GF_OVL0")
WG_KEYS = ("WG_BN", "WG_MT", "WG_STAGES", "WG_INFLIGHT", "WG_PREFETCH")
SMEM_MAX = 232448   # 227 KiB: the sm_90 opt-in limit a block
BK = 128            # K elements a stage
ROW_BYTES = 272     # a staged row: 128 f16 and 16 bytes of padding
TO_F16_THREADS = 256   # to_f16's block: two values a thread
MMA = {"GF_WM": 2, "GF_WN": 4, "GF_TM": 4, "GF_TN": 4}   # gemm_f16.cu's 2 x 4 warps of 4 x 4 tiles
WIDE = {"GF_TM": 8}    # BM 256: the experiment's 8 x 4 tiles a warp (246-255 registers; Q4_0 / Q4_1 spill a little)
WG = {"WG_BN": 128}                      # gemm_f16_wg.cu, 128 activation rows a block
WG_WIDE = {"WG_BN": 256, "WG_INFLIGHT": 0}   # 256 a block, each stage released once its wgmma are done
WG_WIDE_ROWS = 6144   # weights of this many rows and more take WG_WIDE (the 8B: QKV, gate+up; H100, session 43)
_WG_BASE = {"WG_BN": 128, "WG_MT": 1, "WG_STAGES": 4, "WG_INFLIGHT": 1, "WG_PREFETCH": 1}   # the kernel's #defaults
_NULL = np.uint64(0)


def _name(t: int) -> str:
    return MV.TYPES[t][0] if t in MV.TYPES else f"type {t}"


def _check_type(t: int) -> None:
    if t not in TYPES:
        raise MemraError(f"gemm_f16: no f16 kernel for {_name(t)} weights "
                         f"(it has {', '.join(_name(x) for x in TYPES)})")


def default_config(t: int, nb: int = 512, rows: int = 0) -> dict:
    """The built-in tunables for a weight of `rows` rows (2N for a gate+up weight): gemm_f16_wg.cu's
    WG_WIDE from WG_WIDE_ROWS rows, WG below. The same at every row count nb (nothing in a row's
    bits depends on them, nor on the weight's rows: every configuration gives the same bits)."""
    _check_type(t)
    return dict(WG_WIDE if rows >= WG_WIDE_ROWS else WG)


def is_wg(config: dict) -> bool:
    """Whether a launch configuration is gemm_f16_wg.cu's (WG_* keys) rather than gemm_f16.cu's."""
    return any(k.startswith("WG_") for k in config)


def kernel_file(config: dict) -> str:
    return WG_FILE if is_wg(config) else KERNEL_FILE


def launch_config(t: int, nb: int = 512, config: dict | None = None, rows: int = 0) -> dict:
    """The launch's tunables: `config`'s GF_* over MMA (gemm_f16.cu), or its WG_* over
    default_config(t, nb, rows) (gemm_f16_wg.cu), or without either default_config's (a table
    entry, kernel-check's case; other keys are not the family's)."""
    own = {k: int(v) for k, v in (config or {}).items() if k.startswith(("GF_", "WG_"))}
    if any(k.startswith("GF_") for k in own):
        return {**MMA, **own}
    return {**default_config(t, nb, rows), **own}


def tile(config: dict) -> tuple[int, int, int]:
    """(BM weight rows, BN activation rows, NT threads) of a block."""
    if is_wg(config):
        c = {**_WG_BASE, **config}
        return 128 * int(c["WG_MT"]), int(c["WG_BN"]), 384
    wm, wn, tm, tn = (int(config[k]) for k in ("GF_WM", "GF_WN", "GF_TM", "GF_TN"))
    return 16 * tm * wm, 8 * tn * wn, 32 * wm * wn


def smem_bytes(config: dict) -> int:
    """gemm_f16.cu: two stages of BM weight rows and BN activation rows, 272 bytes each;
    gemm_f16_wg.cu: WG_STAGES stages of (BM + BN) rows of 64 f16, 1024 bytes of alignment slack
    and an 8-byte full and empty mbarrier a stage."""
    bm, bn, _ = tile(config)
    if is_wg(config):
        st = int({**_WG_BASE, **config}["WG_STAGES"])
        return st * (bm + bn) * 128 + 1024 + 16 * st
    return 2 * (bm + bn) * ROW_BYTES


def check_config(t: int, config: dict | None = None) -> None:
    """The kernel's static_asserts and limits, on the host."""
    c = launch_config(t, 512, config)
    if is_wg(c):
        _check_wg(t, c)
        return
    bad = [f"unknown tunable {k}" for k in sorted(set(c) - set(KEYS))]
    if not bad:
        bm, bn, nt = tile(c)
        if min(int(c[k]) for k in ("GF_WM", "GF_WN", "GF_TM", "GF_TN")) < 1 or nt > 1024:
            bad.append("GF_WM, GF_WN, GF_TM, GF_TN >= 1, at most 1024 threads")
        elif (2 * bm) % nt or (bn * BK // 8) % nt or int(c["GF_TN"]) % 2:
            bad.append("2 BM and BN 16 multiples of the threads, GF_TN even")
        if int(c.get("GF_OVERLAP", 0)) not in (0, 1) or not 0 <= int(c.get("GF_OVL0", 4)) < BK // 16:
            bad.append("GF_OVERLAP 0 or 1, GF_OVL0 in 0..7")
        if smem_bytes(c) > SMEM_MAX:
            bad.append(f"shared memory {smem_bytes(c)} > {SMEM_MAX}")
    if bad:
        raise MemraError(f"gemm_f16 {_name(t)} {c}: " + "; ".join(bad))


def _check_wg(t: int, c: dict) -> None:
    bad = [f"unknown tunable {k}" for k in sorted(set(c) - set(WG_KEYS))]
    if any(k.startswith("GF_") for k in c):
        bad.append("GF_* and WG_* tunables together (two kernels)")
    w = {**_WG_BASE, **c}
    if not bad:
        if w["WG_BN"] not in (64, 128, 256) or w["WG_MT"] not in (1, 2):
            bad.append("WG_BN 64, 128 or 256, WG_MT 1 or 2")
        if w["WG_INFLIGHT"] not in (0, 1) or w["WG_PREFETCH"] not in (0, 1):
            bad.append("WG_INFLIGHT and WG_PREFETCH 0 or 1")
        if w["WG_STAGES"] < 2 + w["WG_INFLIGHT"]:
            bad.append("WG_STAGES >= 2 + WG_INFLIGHT")
        elif smem_bytes(c) > SMEM_MAX:
            bad.append(f"shared memory {smem_bytes(c)} > {SMEM_MAX}")
    if bad:
        raise MemraError(f"gemm_f16 {_name(t)} {c}: " + "; ".join(bad))


def k_multiple(t: int) -> int:
    """K's step: a stage's 128 elements and whole blocks of the type (256 for the K-quants)."""
    return lcm(BK, MV.TYPES[t][1])


def check_shape(t: int, config: dict | None, N: int, K: int, nb: int, glu: bool) -> None:
    """The host contract (the kernel's header): a type it has, N a multiple of the output tile
    (OBM = BM, glu BM / 2: no partial row tile), K of k_multiple (128; the K-quants and IQ4_XS 256),
    nb >= 1, the int32 arguments in range."""
    _check_type(t)
    cfg = launch_config(t, nb, config, 2 * N if glu else N)
    check_config(t, cfg)
    bm, _, _ = tile(cfg)
    obm = bm // 2 if glu else bm
    bad = tile_shape_problems(N, obm, K, k_multiple(t), nb)
    if max(2 * N, K, nb) >= 2 ** 31 or nb * K >= 2 ** 31:
        bad.append("the int32 arguments overflow (N, K, nb, nb K < 2^31)")
    if bad:
        raise MemraError(f"gemm_f16 {_name(t)}{' glu' if glu else ''}: " + "; ".join(bad))


def launch_shape(t: int, config: dict | None, N: int, nb: int, glu: bool):
    """((ceil(nb / BN), N / OBM, 1), (NT, 1, 1), smem bytes). N = output rows."""
    c = launch_config(t, nb, config, 2 * N if glu else N)
    check_config(t, c)
    bm, bn, nt = tile(c)
    obm = bm // 2 if glu else bm
    if N <= 0 or N % obm or nb < 1:
        raise MemraError(f"gemm_f16: N = {N} must be a positive multiple of {obm}, nb >= 1")
    return (-(-nb // bn), N // obm, 1), (nt, 1, 1), smem_bytes(c)


def supports(t: int, N: int, K: int, glu: bool) -> bool:
    """Whether the prompt rows (MEMRA_PROMPT_GEMM=f16, the default) take gemm_f16 for a weight of type t with N
    output rows (glu: 2N weight rows) of K: a type it has and the host contract of the built-in
    configuration. A function of the weight alone, never of the row count: a prompt row's bits
    must not depend on the chunk it is in."""
    if t not in TYPES:
        return False
    try:
        check_shape(t, None, N, K, 1, glu)
    except MemraError:
        return False
    return True


def gemm_f16(g, w, y, *, xh, nb: int, residual=None, glu: str | None = None, config: dict | None = None,
             canary: int = 0, pdl: bool = False) -> None:
    """y[b, :] (+)= W xh[b, :] for b < nb on the f16 activations xh (uint16 bits, nb rows of K)."""
    t = w.ggml_type
    MV.check_glu("gemm_f16", glu, w.rows)
    if glu and residual is not None:
        raise MemraError("gemm_f16: the glu entry takes no residual")
    N, K = (w.rows // 2 if glu else w.rows), w.K
    cfg = launch_config(t, nb, config, w.rows)
    check_shape(t, cfg, N, K, nb, bool(glu))
    arch = getattr(getattr(g, "info", None), "arch", WG_ARCH)
    if is_wg(cfg) and arch != WG_ARCH:
        if is_wg(config or {}):
            raise MemraError(f"gemm_f16: the wgmma kernel ({WG_FILE}) needs {WG_ARCH}, this GPU is {arch}: "
                             f"give a GF_* configuration (gemm_f16.cu's mma.sync)")
        cfg = dict(MMA)   # the built-in elsewhere: gemm_f16.cu (kernel-check: every configuration the same bits)
    if xh.dtype != np.uint16 or xh.size < nb * K:
        raise MemraError(f"gemm_f16: xh must be uint16 (f16 bits) with >= {nb}x{K} values")
    if y.dtype != np.float32 or y.size < nb * N or (residual is not None and residual.size < nb * N):
        raise MemraError(f"gemm_f16: y (and residual) must be f32 with >= {nb}x{N} values")
    grid, block, smem = launch_shape(t, cfg, N, nb, bool(glu))
    m = g.module(kernel_file(cfg), MV.type_defines(t, cfg, canary))
    if glu:
        g.launch(m.kernel("gemm_f16_glu"), grid, block,
                 (w.bulk, w.meta, xh, y, np.int32(N), np.int32(K), np.int32(nb), np.int32(MV.ACTS[glu])),
                 shmem=smem, pdl=pdl)
    else:
        g.launch(m.kernel("gemm_f16"), grid, block,
                 (w.bulk, w.meta, xh, y, residual if residual is not None else _NULL, np.int32(N), np.int32(K),
                  np.int32(nb)), shmem=smem, pdl=pdl)


def to_f16(g, x, xh, n: int, pdl: bool = False, canary: int = 0) -> None:
    """xh[:n] = f16 bits of x[:n] (round to nearest even), from the module built without MV_TYPE."""
    if x.dtype != np.float32 or xh.dtype != np.uint16 or x.size < n or xh.size < n:
        raise MemraError(f"to_f16: x must be f32 and xh uint16 with >= {n} values")
    if not 1 <= n < 2 ** 31:
        raise MemraError(f"to_f16: n = {n} outside 1..2^31-1")
    m = g.module(KERNEL_FILE, {"MEMRA_CANARY": canary} if canary else {})
    g.launch(m.kernel("to_f16"), (-(-n // (2 * TO_F16_THREADS)), 1, 1), (TO_F16_THREADS, 1, 1),
             (x, xh, np.int32(n)), pdl=pdl)


# -- kernel-check -----------------------------------------------------------------------

# The oracle's bound, max |got - ref| / max |ref|: the reference is the float64 product of the very
# operands the kernel multiplies (the f16-rounded weights and activations), whose products are exact
# in f32, so all the kernel may add is its f32 accumulation: one rounding a k16 step (<= 2^-24 of the
# running sum, and the mma's own alignment inside a step, a few ulp), K / 16 steps, errors that
# mostly cancel: ~sqrt(K / 16) 2^-24 ~ 1e-6 of the largest output at K = 14336, and the worst case of
# every rounding one way (K / 16 x a few ulp ~ 2e-4 of the largest partial sum) is not met by random
# data. 1e-4 (experiments/gemm_f16/probe.py's bound) sits 100x above the first and far below what
# the checks exist to catch: one dropped or repeated k16 step moves an output by ~sqrt(16 / K) of
# its size (>= 3 % at K = 14336), a wrong row or column by all of it.
TOL = 1e-4
# (nb, glu, residual aliasing y): one row, a partial column tile, glu at both activations, a residual
# over more than one column tile, a whole 128-row tile
_CHECK = ((1, None, False), (9, None, False), (64, "silu", False), (130, None, True), (33, "gelu", False),
          (128, None, False))
_CHECK_N, _CHECK_K = 256, 1024
# configurations whose bits kernel-check compares with the built-in one's (gemm_f16_wg.cu's WG at the
# check's weights), on every type: gemm_f16.cu's mma.sync (its tile, the wide tile, the overlapped
# dequant, 4 x 2 warps) and the wgmma kernel's other instruction shape (m64n256), its stage release
# and two m64 tiles a consumer
_CONFIGS = (MMA, WIDE, {**WIDE, "GF_OVERLAP": 1}, {"GF_WM": 4, "GF_WN": 2}, WG_WIDE, {"WG_BN": 256},
            {"WG_MT": 2, "WG_PREFETCH": 0})


def compile_variants() -> list[tuple[str, dict]]:
    out = [(KERNEL_FILE, {})]
    for t in TYPES:
        for c in (WG, *_CONFIGS):
            cfg = launch_config(t, config=c)
            out.append((kernel_file(cfg), MV.type_defines(t, cfg)))
    out += [(WG_FILE, MV.type_defines(12, WG, canary=1)), (KERNEL_FILE, MV.type_defines(12, MMA, canary=1)),
            (KERNEL_FILE, {"MEMRA_CANARY": 2})]
    return out


def _x(rng, nb: int, K: int) -> np.ndarray:
    return (rng.standard_normal((nb, K)) * rng.uniform(0.5, 4)).astype(np.float32)


def _launch(g, w, xh, nb: int, rows_out: int, config, canary: int, glu=None, residual=None, row0: int = 0):
    """One gemm_f16 launch over rows row0..row0 + nb - 1 of xh on a poisoned y (or the residual
    aliased as y); returns y's values."""
    K = w.K
    y = residual if residual is not None else g.empty((nb, rows_out), np.float32)
    if residual is None:
        y.poison()
    gemm_f16(g, w, y, xh=xh.view(shape=(nb, K), offset=2 * row0 * K), nb=nb, residual=residual, glu=glu,
             config=config, canary=canary)
    g.sync()
    return y.numpy()


def against_ref(g, rng, name: str, t: int, raw: np.ndarray, nb: int, glu: str | None, alias: bool,
                config=None, canary: int = 0):
    """The kernel on GGUF rows `raw` (2N rows for glu) and nb random activation rows: to_f16 against
    astype(float16) bit for bit; the plain kernel over every row against the float64 product of the
    f16-rounded operands (TOL); its first c and last c rows launched alone, bit for bit; then glu:
    the glu kernel against act_mul of the plain gate and up outputs bit for bit (and the float64
    reference), or a residual aliased as y: fl(plain + r) bit for bit."""
    from memra.gpu.compare import Outcome, compare, epilogue, rows_alone
    from memra.gpu.ops import act as ACT

    w = MV.upload_weight(g, raw, t)
    rows, K = raw.shape[0], w.K
    N = rows // 2 if glu else rows
    x = _x(rng, nb, K)
    xh = g.empty((nb, K), np.uint16)
    xh.poison()
    to_f16(g, g.to_device(x), xh, nb * K)
    g.sync()
    x16 = x.astype(np.float16)
    bad = int(np.count_nonzero(xh.numpy() != x16.view(np.uint16)))
    if bad:
        return Outcome(name, False, f"to_f16: {bad} of {x.size} values differ from astype(float16)")
    wf = MV.dequant_rows(raw, t).astype(np.float16).astype(np.float64)
    prod = x16.astype(np.float64) @ wf.T                                  # [nb, rows]
    plain = _launch(g, w, xh, nb, rows, config, canary)
    o = compare(name + " (plain)", plain, prod, TOL, kind="max")
    if not o.ok:
        return o
    alone = rows_alone(name, plain, lambda r0, n: _launch(g, w, xh, n, rows, config, canary, row0=r0), o.err)
    if alone is not None:
        return alone
    if not glu and not alias:
        return Outcome(name, True, o.detail + "; rows alone = in the batch bit for bit", o.err)
    if glu:
        want = ACT.act_mul_of(g, plain, MV.ACT_MUL[glu])
        got = _launch(g, w, xh, nb, N, config, canary, glu=glu)
        ref = MV.matvec_ref(wf, x16.astype(np.float64), None, glu)
        what = "act_mul of the plain gate and up outputs"
    else:
        res = rng.standard_normal((nb, N)).astype(np.float32)
        want = plain + res                                                   # float32: one rounding
        got = _launch(g, w, xh, nb, N, config, canary, residual=g.to_device(res))
        ref = prod + res.astype(np.float64)
        what = "fl(plain + residual)"
    return epilogue(name, got, ref, want, what, TOL)


def check_case(g, rng, t: int, nb: int, glu: str | None, alias: bool, config=None, canary: int = 0,
               N: int = _CHECK_N, K: int = _CHECK_K):
    raw = MV.random_weight(t, 2 * N if glu else N, K, rng)
    name = (f"gemm_f16 {_name(t)} nb={nb} {N}x{K}{' glu-' + glu if glu else ''}"
            f"{' +res(alias y)' if alias else ''}"
            f"{' ' + ','.join(f'{k}={v}' for k, v in config.items()) if config else ''}")
    return against_ref(g, rng, name, t, raw, nb, glu, alias, config, canary)


def check_configs(g, rng, t: int, glu: str | None, nb: int = 77, N: int = _CHECK_N, K: int = _CHECK_K):
    """Every configuration of _CONFIGS gives the built-in configuration's bits (which check_case holds
    to the reference) on the same weight and activations."""
    from memra.gpu.compare import Outcome, bits_differ

    w = MV.upload_weight(g, MV.random_weight(t, 2 * N if glu else N, K, rng), t)
    xh = g.to_device(_x(rng, nb, K).astype(np.float16).view(np.uint16))
    name = f"gemm_f16 {_name(t)} nb={nb} {N}x{K}{' glu-' + glu if glu else ''} configurations"
    base = _launch(g, w, xh, nb, N, None, 0, glu=glu)
    if not np.all(np.isfinite(base)):
        return Outcome(name, False, "the built-in configuration left outputs unwritten")
    for c in _CONFIGS:
        bad = bits_differ(_launch(g, w, xh, nb, N, c, 0, glu=glu), base)
        if bad:
            return Outcome(name, False, f"{c}: {bad} of {base.size} values differ from the built-in's bits")
    return Outcome(name, True, f"{len(_CONFIGS)} configurations = the built-in's bits", 0.0)


def check_to_f16(g, rng, rows: int, K: int, canary: int = 0):
    """to_f16 over rows x K values (an odd count takes the kernel's one-value tail) with values past
    f16's range (inf), in its subnormal range and exact halfway cases, against astype(float16)."""
    from memra.gpu.compare import Outcome

    x = _x(rng, rows, K).reshape(-1)
    n = x.size
    m = min(n, 64)
    x[:m] *= np.float32(2.0) ** rng.integers(-30, 18, m).astype(np.float32)
    if n > 70:   # halfway between two f16 values: ties to even
        x[m:m + 6] = np.array([1 + 2 ** -11, 1 + 3 * 2 ** -11, -(2 + 2 ** -10), 65520.0, 2 ** -25, -3 * 2 ** -25],
                              np.float32)
    xh = g.empty(n, np.uint16)
    xh.poison()
    to_f16(g, g.to_device(x), xh, n, canary=canary)
    g.sync()
    with np.errstate(over="ignore"):
        want = x.astype(np.float16).view(np.uint16)
    bad = int(np.count_nonzero(xh.numpy() != want))
    return Outcome(f"to_f16 n={n}{' canary ' + str(canary) if canary else ''}", bad == 0,
                   "= astype(float16) bit for bit" if not bad else f"{bad} of {n} values differ from astype(float16)",
                   0.0 if not bad else np.inf)


def checks(g, rng: np.random.Generator) -> Iterator:
    for rows, K in ((1, 4096), (3, 333), (512, 14336)):
        yield check_to_f16(g, rng, rows, K)
    for t in TYPES:
        for nb, glu, alias in _CHECK:
            yield check_case(g, rng, t, nb, glu, alias)
    # an 8B layer's shapes at a prefill chunk and a decode batch (partial column tiles), and the wide tiles
    for t, N, K, glu in ((12, 512, 4096, "silu"), (14, 256, 14336, None)):
        for nb in (16, 512):
            yield check_case(g, rng, t, nb, glu, alias=glu is None, N=N, K=K)
    yield check_case(g, rng, 12, 200, "silu", False, config=WIDE)
    yield check_case(g, rng, 12, 300, "silu", False, config=WG_WIDE)
    yield check_case(g, rng, 14, 300, None, True, config=MMA)
    for i, t in enumerate(TYPES):
        yield check_configs(g, rng, t, "silu" if i % 2 == 0 else None)


def canaries(g, rng: np.random.Generator) -> Iterator:
    yield check_case(g, rng, 12, 33, None, alias=False, canary=1)
    yield check_case(g, rng, 12, 33, None, alias=False, config=MMA, canary=1)
    yield check_to_f16(g, rng, 3, 333, canary=2)


# -- the launch set (memra.tune.launches: the engine's own launches, run by kernel-check) ----------

_LAUNCH_N = 256   # output rows checked of a larger weight (a multiple of every output tile up to BM 256)


def launch_cases(L, ctx) -> list[dict]:
    """A plan launch of op to_f16 (the module without MV_TYPE, one case per row bucket and K) or
    gemm_f16: the module the launcher builds (launch_config with the launch's tunables over it), the
    exact batch, the K it loops over and whether the output aliases the residual."""
    if L.op == "to_f16":
        K, b = int(L.shape["n"]), launch_bucket(L.rows)
        return [{"file": KERNEL_FILE, "entry": "to_f16", "defines": {}, "bucket": b, "tag": f"K{K}",
                 "params": {"K": K, "rows": b}}]
    t = MV.type_id(L.shape["type"])
    glu, nb, K = L.args.get("glu"), int(L.rows), int(L.shape["cols"])
    N = int(L.shape["rows"]) // (2 if glu else 1)
    cfg = launch_config(t, nb, L.config, int(L.shape["rows"]))
    res = bool(L.args.get("res"))
    return [{"file": kernel_file(cfg), "entry": "gemm_f16_glu" if glu else "gemm_f16",
             "defines": MV.type_defines(t, cfg), "bucket": nb, "tag": f"K{K}" + (" res=y" if res else ""),
             "params": {"type": t, "N": N, "K": K, "nb": nb, "glu": glu, "res": res}}]


def check_launch(g, rng, case):
    """to_f16 at the case's rows and K against astype(float16); gemm_f16 at the launch's module,
    batch, K and residual aliasing on a random weight (at most _LAUNCH_N output rows), as
    against_ref."""
    p = case["params"]
    if case["entry"] == "to_f16":
        return check_to_f16(g, rng, p["rows"], p["K"])
    t, nb, K, glu, alias = p["type"], p["nb"], p["K"], p["glu"], p["res"]
    cfg = {k: v for k, v in case["defines"].items() if k in KEYS or k in WG_KEYS}
    bm = tile(launch_config(t, nb, cfg))[0]
    obm = bm // 2 if glu else bm
    N = p["N"] if p["N"] <= _LAUNCH_N else max(obm, _LAUNCH_N // obm * obm)
    raw = MV.random_weight(t, 2 * N if glu else N, K, rng)
    name = f"{case['entry']} {_name(t)} nb={nb} {N}x{K}{' res=y' if alias else ''} {cfg}"
    return against_ref(g, rng, name, t, raw, nb, glu, alias, cfg)


# -- the tune hooks (memra/tune/measure.py; campaign tune/campaigns/h200-gemm-f16.toml): kernel
# "gemm_f16" | "gemm_f16_glu", variant "f16", shape {type, rows (2N for _glu: gate and up stacked),
# cols, batch}; config WG_* (gemm_f16_wg.cu) or GF_* (gemm_f16.cu) laid over default_config(type,
# batch, rows) (launch_config, as the plan's table entries are). The outputs depend neither on the
# configuration nor on the kernel, so every one is checked against the same bits. The campaign's src is
# gemm_f16.cu+gemm_f16_wg.cu: a receipt's source hash covers both kernels.

VARIANT = "f16"
# the kernels tune_case measures and their variants (memra tune run checks a campaign's names against them)
TUNE_VARIANTS = {"gemm_f16": (VARIANT,), "gemm_f16_glu": (VARIANT,)}
_TUNE_ROWS = 128   # output rows a tune check holds to the float64 product (its cost: nb x K x 128 on the host)
# Per (batch, glu) of the cached weight (memra.gpu.ops.matvec's shape cache): the f16 activations,
# the float64 product of the first _TUNE_ROWS outputs and the built-in configuration's bits, made
# once for all the configurations of a shape and batch (a campaign runs them in a row)
_INPUTS: dict[tuple, tuple] = {}


def _tune_args(kernel: str, variant: str, config: dict, shape: dict):
    """(type id, glu, N, K, nb, launch config) of a tune job, or MemraError: unknown kernel,
    variant, type or tunable, GF_* and WG_* together, or a configuration check_shape refuses
    (before any compile)."""
    if variant not in TUNE_VARIANTS.get(kernel, ()):
        raise MemraError(f"gemm_f16 tune: unknown kernel/variant {kernel}/{variant} "
                         f"(it measures {', '.join(k + '/' + VARIANT for k in TUNE_VARIANTS)})")
    t = MV.type_id(shape["type"])
    _check_type(t)
    config = dict(config or {})
    bad = sorted(set(config) - set(KEYS) - set(WG_KEYS))
    if bad:
        raise MemraError(f"gemm_f16 tune: unknown tunables {bad} (known: {', '.join(WG_KEYS + KEYS)})")
    if is_wg(config) and any(k.startswith("GF_") for k in config):
        raise MemraError(f"gemm_f16 tune: {config} mixes GF_* (gemm_f16.cu) and WG_* (gemm_f16_wg.cu) tunables")
    glu, rows, K, nb = kernel == "gemm_f16_glu", int(shape["rows"]), int(shape["cols"]), int(shape.get("batch", 1))
    if glu and rows % 2:
        raise MemraError(f"gemm_f16 tune: a gemm_f16_glu weight stacks gate and up (an even row count, got {rows})")
    N = rows // 2 if glu else rows
    cfg = launch_config(t, nb, config, rows)
    check_shape(t, cfg, N, K, nb, glu)
    return t, glu, N, K, nb, cfg


class _TuneCase:
    """The shape's weight in the planes layout (copies rotating past the L2: memra.gpu.ops.matvec's
    shape cache), nb rows of random f16 activations, the job's configuration (launched as the
    planner launches a table entry's). The references: the float64 product of the f16-rounded
    operands for the first _TUNE_ROWS outputs (act(gate) * up for glu), and the built-in
    configuration's launch for every output's bits (the outputs do not depend on the
    configuration, and kernel-check holds the built-in one to the float64 product)."""

    def __init__(self, g, t, glu, N, K, nb, config, rng, rotate_bytes):
        self.g, self.t, self.glu, self.N, self.K, self.nb, self.config = g, t, glu, N, K, nb, config
        self.ws, wf = MV._shape_weights(g, t, 2 * N if glu else N, K, rng, rotate_bytes)
        self.sets = len(self.ws)
        hit = _INPUTS.get((nb, glu))
        if hit is None or hit[0] is not self.ws[0]:  # the weight object itself: ids are reused
            _INPUTS.clear()
            hit = _INPUTS[(nb, glu)] = (self.ws[0], self._inputs(wf, rng))
        self.xh, self.ref, self.bits = hit[1]
        self.y = g.empty((nb, N), np.float32)
        self.bytes = self.ws[0].nbytes + nb * (2 * K + 4 * N)

    def _inputs(self, wf, rng):
        g, nb, K, N, act = self.g, self.nb, self.K, self.N, "silu" if self.glu else None
        x16 = _x(rng, nb, K).astype(np.float16)
        xh = g.to_device(x16.view(np.uint16))
        R = min(N, _TUNE_ROWS)
        w16 = wf[np.r_[0:R, N:N + R]] if act else wf[:R]
        ref = MV.matvec_ref(w16.astype(np.float16).astype(np.float64), x16.astype(np.float64), None, act)
        yb = g.empty((nb, N), np.float32)
        yb.poison()
        gemm_f16(g, self.ws[0], yb, xh=xh, nb=nb, glu=act)
        g.sync()
        return xh, ref, yb.numpy().view(np.uint32).copy()

    def launch(self, i: int) -> None:
        gemm_f16(self.g, self.ws[i % self.sets], self.y, xh=self.xh, nb=self.nb,
                 glu="silu" if self.glu else None, config=self.config)

    def check(self):
        """One launch on a poisoned y: its first _TUNE_ROWS outputs against the float64 product at
        TOL, then every output against the built-in configuration's bits."""
        from memra.gpu.compare import tune_check

        self.y.poison()
        self.launch(0)
        self.g.sync()
        return tune_check("gemm_f16", self.y.numpy(), self.ref, self.bits, TOL)


def tune_case(g, kernel: str, variant: str, config: dict, shape: dict, rng, rotate_bytes: int):
    t, glu, N, K, nb, _ = _tune_args(kernel, variant, config, shape)
    return _TuneCase(g, t, glu, N, K, nb, dict(config or {}), rng, rotate_bytes)


def is_builtin(kernel: str, variant: str, config: dict, shape: dict) -> bool:
    """Whether a tune job's configuration is what the launcher runs on sm_90a without a table for
    its weight (default_config by the weight's rows, 2N for _glu), the kernel's #defaults filled
    in on both sides; False for a configuration the hooks refuse."""
    try:
        t, _, _, _, nb, cfg = _tune_args(kernel, variant, config, shape)
    except MemraError:
        return False
    want = default_config(t, nb, int(shape["rows"]))
    return is_wg(cfg) and {**_WG_BASE, **cfg} == {**_WG_BASE, **want}


def tune_modules(kernel: str, variant: str, config: dict, shape: dict) -> list[tuple[str, dict]]:
    """The module a tune job loads on sm_90a (gemm_f16_wg.cu for WG_*, gemm_f16.cu for GF_*), for the
    campaign's parallel precompile (a refused configuration raises: never compiled, its job
    records why)."""
    t, _, _, _, _, cfg = _tune_args(kernel, variant, config, shape)
    return [(kernel_file(cfg), MV.type_defines(t, cfg))]
