"""Decode matrix-vector products on GGUF-quantized weights (kernels/matvec.cu, kernels/q8.cu).

    w = upload_weight(g, data, ggml_type)            # data: (rows, row_bytes) uint8 GGUF rows,
                                                     # or a list of such (fused QKV / gate+up)
    quantize_q8(g, x, xq, xs, nb)                    # x [B, K] f32 -> xq [B, K] int8, xs [B, K/32] Q8_SCALE
    matvec(g, w, y, xq=xq, xs=xs, nb=nb)             # int8 activations, dp4a   (path "q8")
    matvec(g, w, y, x=x, nb=nb)                      # f32 activations, FMA     (path "f32")
        residual=r   y = r + W x (r may be y itself)
        glu="silu"|"gelu"   W holds [gate; up] (2N rows): y = act(gate x) * (up x), y is [B, N]

Weights are re-laid out at load into two planes (bulk quant bytes, meta scale bytes) per
matrix: `pack_planes` / `unpack_planes` are exact inverses (tested on the CPU). Rows of
several matrices of one type can be stacked into one weight (fused QKV, gate+up): the
outputs then come out stacked in y.

References: float64 dequant(W) @ x for the f32 path, float64 dequant(W) @ (d * q) for the
q8 path with x quantized by `quantize_q8_ref` (bit-exact with the kernel's rule).
Tolerance TOL (relative, L2) for both: only float rounding separates kernel and reference.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import numpy as np

from memra.errors import MemraError, UnsupportedModelError
from memra.gpu.ops import launch_bucket, pdl_trigger_define
from memra.gpu.q8 import Q8_SCALE, quantize_q8_ref
from memra.model.quants import F16_FIELDS

KERNEL_FILE = "matvec.cu"
Q8_FILE = "q8.cu"
TOL = 1e-5
Q8_WARPS = 8
_NULL = np.uint64(0)

# ggml type id -> (name, elements per block, bytes per block, bulk offset, bulk bytes);
# the rest of each block (before and after the bulk bytes) is its meta.
TYPES: dict[int, tuple[str, int, int, int, int]] = {
    0: ("F32", 1, 4, 0, 4),
    1: ("F16", 1, 2, 0, 2),
    30: ("BF16", 1, 2, 0, 2),
    2: ("Q4_0", 32, 18, 2, 16),
    3: ("Q4_1", 32, 20, 4, 16),
    6: ("Q5_0", 32, 22, 6, 16),
    7: ("Q5_1", 32, 24, 8, 16),
    8: ("Q8_0", 32, 34, 2, 32),
    12: ("Q4_K", 256, 144, 16, 128),
    13: ("Q5_K", 256, 176, 16, 160),
    14: ("Q6_K", 256, 210, 0, 192),
    23: ("IQ4_XS", 256, 136, 8, 128),
}
FLOAT_TYPES = frozenset({0, 1, 30})
BUCKETS = (1, 4, 8)
ACTS = {None: 0, "silu": 1, "gelu": 2}   # a glu activation: the kernels' act argument (1 SiLU, 2 GELU-tanh)
ACT_MUL = {"silu": "silu", "gelu": "gelu_tanh"}   # the same activation as kernels/act.cu's act_mul names it


def check_glu(family: str, glu, rows: int) -> None:
    """The glu argument every matmul family takes: None or an ACTS activation, and for one a weight
    stacking gate and up (an even row count)."""
    if glu not in ACTS:
        raise MemraError(f"{family}: glu must be None, 'silu' or 'gelu' (got {glu!r})")
    if glu and rows % 2:
        raise MemraError(f"{family}: a GLU weight stacks gate and up (an even row count)")


def type_defines(t: int, config: dict, canary: int = 0) -> dict:
    """A weight-type family's module defines: MV_TYPE, the launch's tunables, MEMRA_CANARY when set."""
    d = {"MV_TYPE": t, **config}
    if canary:
        d["MEMRA_CANARY"] = canary
    return d


def type_id(t) -> int:
    if isinstance(t, str):
        for k, v in TYPES.items():
            if v[0] == t.upper():
                return k
        raise UnsupportedModelError(f"matvec: unknown weight type {t!r}")
    if int(t) not in TYPES:
        raise UnsupportedModelError(f"matvec: no kernel for ggml type {int(t)} "
                                    f"(supported: {', '.join(v[0] for v in TYPES.values())})")
    return int(t)


def bucket(nb: int) -> int:
    for b in BUCKETS:
        if nb <= b:
            return b
    return BUCKETS[-1]


def check_k(ggml_type: int, K: int) -> None:
    name, blk = TYPES[ggml_type][0], TYPES[ggml_type][1]
    if K % 64 or K % blk:
        raise UnsupportedModelError(f"matvec: {name} rows of {K} values (need a multiple of "
                                    f"{max(64, blk)})")


# ---------------------------------------------------------------------------------------
# layout

def pack_planes(data: np.ndarray, ggml_type: int) -> tuple[np.ndarray, np.ndarray]:
    """(rows, row_bytes) GGUF rows -> (bulk (rows, nblk*BULK), meta (rows, nblk*META))."""
    name, blk, bb, bo, bl = TYPES[ggml_type]
    data = np.ascontiguousarray(data, dtype=np.uint8)
    if data.ndim != 2 or data.shape[1] % bb:
        raise MemraError(f"matvec: {name} data of shape {data.shape} is not whole blocks")
    rows, nblk = data.shape[0], data.shape[1] // bb
    if ggml_type in FLOAT_TYPES:
        return data, np.zeros((rows, 0), np.uint8)
    blocks = data.reshape(rows, nblk, bb)
    bulk = np.ascontiguousarray(blocks[:, :, bo:bo + bl]).reshape(rows, nblk * bl)
    meta = np.concatenate([blocks[:, :, :bo], blocks[:, :, bo + bl:]], axis=2)
    return bulk, np.ascontiguousarray(meta).reshape(rows, -1)


def unpack_planes(bulk: np.ndarray, meta: np.ndarray, ggml_type: int) -> np.ndarray:
    """Inverse of pack_planes."""
    name, blk, bb, bo, bl = TYPES[ggml_type]
    if ggml_type in FLOAT_TYPES:
        return bulk.copy()
    rows = bulk.shape[0]
    nblk = bulk.shape[1] // bl
    b = bulk.reshape(rows, nblk, bl)
    m = meta.reshape(rows, nblk, bb - bl)
    return np.concatenate([m[:, :, :bo], b, m[:, :, bo:]], axis=2).reshape(rows, nblk * bb)


@dataclass
class Weight:
    """One matrix (or several of one type stacked by rows) on the device, in planes."""
    ggml_type: int
    rows: int
    K: int
    buf: object      # DeviceArray owning both planes
    bulk: object     # DeviceArray view
    meta: object     # DeviceArray view (the bulk view again for float types)

    @property
    def nbytes(self) -> int:
        """Bytes one product reads from the weight (= the GGUF size of the rows)."""
        return self.rows * self.K // TYPES[self.ggml_type][1] * TYPES[self.ggml_type][2]


def upload_weight(g, data, ggml_type) -> Weight:
    """GGUF rows -> device planes. `data`: (rows, row_bytes) uint8 or a list of them (same
    type and K), stacked by rows in order."""
    t = type_id(ggml_type)
    parts = list(data) if isinstance(data, (list, tuple)) else [data]
    parts = [np.asarray(p, dtype=np.uint8) for p in parts]
    row_bytes = parts[0].shape[-1]
    if any(p.ndim != 2 or p.shape[1] != row_bytes for p in parts):
        raise MemraError("matvec: stacked weights need equal row sizes")
    name, blk, bb, _, _ = TYPES[t]
    K = row_bytes // bb * blk
    check_k(t, K)
    bulk, meta = pack_planes(np.concatenate(parts, axis=0) if len(parts) > 1 else parts[0], t)
    rows = bulk.shape[0]
    boff = (bulk.nbytes + 255) // 256 * 256
    buf = g.empty(boff + max(meta.nbytes, 16), np.uint8)
    host = np.zeros(buf.nbytes, np.uint8)
    host[:bulk.nbytes] = bulk.ravel()
    host[boff:boff + meta.nbytes] = meta.ravel()
    buf.upload(host)
    bv = buf.view(np.uint8, (bulk.nbytes,), 0)
    mv = buf.view(np.uint8, (max(meta.nbytes, 16),), boff) if meta.nbytes else bv
    return Weight(t, rows, K, buf, bv, mv)


# ---------------------------------------------------------------------------------------
# launchers

def default_config(ggml_type: int, path: str, N: int, K: int, nb: int, glu: bool = False) -> dict:
    """Built-in tunables (a tuning table overrides them): the simple rule that came closest
    to each shape's best in the first H200 sweep (research/2026-11-30-matvec-sweep/matvec-h200-2026-11-30.jsonl).
    MV_KSPLIT stays 1, so a row sums in the same order at every batch size."""
    if path == "f32" or ggml_type in FLOAT_TYPES:
        return {"MV_NWARPS": 4, "MV_ROWS": 1, "MV_KSPLIT": 1, "MV_UNROLL": 1}
    if bucket(nb) > 1:
        return {"MV_NWARPS": 4, "MV_ROWS": 2, "MV_KSPLIT": 1, "MV_UNROLL": 1}
    if K > 1024 and (glu or ggml_type == 8):
        return {"MV_NWARPS": 4, "MV_ROWS": 1, "MV_KSPLIT": 1, "MV_UNROLL": 1}
    return {"MV_NWARPS": 4, "MV_ROWS": 2, "MV_KSPLIT": 1, "MV_UNROLL": 2}


def _module(g, ggml_type: int, n: int, config: dict, canary: int = 0):
    return g.module(KERNEL_FILE, module_defines(ggml_type, n, config, canary))


def xsmem_bytes(nb: int, K: int) -> int:
    """Dynamic shared memory of an MV_XSMEM launch: nb rows of tile-interleaved int8
    activations (2048 B per 32 units) and their scales (1024 B per 32 units)."""
    return nb * -(-K // 2048) * 3072


def rows_per_block(config: dict) -> int:
    return config["MV_ROWS"] * config["MV_NWARPS"] // config["MV_KSPLIT"]


def grid_for(N: int, config: dict) -> int:
    """Blocks of a launch over N output rows: ceil(N / rows per block) (matvec.cu's contract)."""
    return -(-N // rows_per_block(config))


def launch_config(ggml_type: int, q8: bool, N: int, K: int, n: int, glu: bool, config: dict | None = None,
                  tuned=None) -> dict:
    """The tunables of one launch of n <= 8 rows: `config` when given, else the built-in
    default with a table's choice (tuned(n), see `matvec`) laid over it."""
    cfg = config or default_config(ggml_type, "q8" if q8 else "f32", N, K, n, glu)
    if not config and tuned is not None:
        cfg = {**cfg, **(tuned(n) or {})}
    return cfg


def module_defines(ggml_type: int, n: int, config: dict, canary: int = 0) -> dict:
    """The -D defines of the module a launch of n rows with `config` loads."""
    d = {"MV_TYPE": ggml_type, "MV_B": bucket(n), **config}
    if canary:
        d["MEMRA_CANARY"] = canary
    return d


def q8_defines(config: dict | None) -> dict:
    """A quantize_q8 module's -D defines from a table entry's configuration: Q8_WARPS (default Q8_WARPS) and,
    where the entry names it, Q8_PDL_TRIGGER (kernels/q8.cu: 0 never, 1 after the PDL wait, 2 before it)."""
    c = config or {}
    warps = int(c.get("Q8_WARPS", Q8_WARPS))
    if not 1 <= warps <= 32:
        raise MemraError(f"quantize_q8: Q8_WARPS must be in 1..32, got {warps}")
    return {"Q8_WARPS": warps, **pdl_trigger_define(c, "Q8_PDL_TRIGGER", "quantize_q8")}


def quantize_q8(g, x, xq, xs, nb: int, canary: bool = False, config: dict | None = None, pdl: bool = False) -> None:
    """x [>=nb, K] f32 -> xq [.., K] int8, xs [.., K/32] Q8_SCALE (rows < nb written).
    config: a tuning table's choice (q8_defines: Q8_WARPS, Q8_PDL_TRIGGER); pdl: a programmatic dependent launch."""
    K = x.shape[-1]
    if x.dtype != np.float32 or xq.dtype != np.int8 or xs.dtype != Q8_SCALE or K % 32:
        raise MemraError(f"quantize_q8: need f32 x, int8 xq, Q8_SCALE xs, K % 32 == 0 "
                         f"(got {x.dtype}, {xq.dtype}, {xs.dtype}, K={K})")
    nblocks = nb * K // 32
    if xq.size < nb * K or xs.size < nblocks or x.size < nb * K:
        raise MemraError("quantize_q8: arrays smaller than nb rows")
    d = q8_defines(config)
    if canary:
        d["MEMRA_CANARY"] = 2
    k = g.module(Q8_FILE, d).kernel("quantize_q8")
    warps = d["Q8_WARPS"]
    g.launch(k, ((nblocks + warps - 1) // warps,), (32 * warps,),
             (x, xq, xs, np.int32(nblocks)), pdl=pdl)


def matvec(g, w: Weight, y, *, x=None, xq=None, xs=None, nb: int = 1, residual=None,
           glu: str | None = None, config: dict | None = None, canary: int = 0,
           pdl: bool = False, tuned=None) -> None:
    """y[b, :] (+)= W x[b, :] for b < nb; q8 path when xq/xs are given, else f32 path.

    config: the tunables of every launch (kernel checks, tune hook). tuned(n) -> dict | None:
    a tuning table's tunables for a launch of n rows, laid over `default_config` as the tune
    hook measured them (None: the built-in default). Launches are per chunk of <= 8 rows."""
    check_glu("matvec", glu, w.rows)
    q8 = xq is not None
    if q8 and w.ggml_type in FLOAT_TYPES:
        raise MemraError(f"matvec: {TYPES[w.ggml_type][0]} weights take f32 activations")
    if (x is None) == (not q8) or (q8 and xs is None):
        raise MemraError("matvec: give either x (f32 path) or xq and xs (q8 path)")
    N = w.rows // 2 if glu else w.rows
    K = w.K
    if y.dtype != np.float32 or y.size < nb * N:
        raise MemraError(f"matvec: y must be f32 with >= {nb}x{N} values")
    if residual is not None and (residual.dtype != np.float32 or residual.size < nb * N):
        raise MemraError("matvec: residual must be f32 like y")
    if q8:
        if xq.dtype != np.int8 or xs.dtype != Q8_SCALE or xq.size < nb * K or xs.size < nb * K // 32:
            raise MemraError("matvec: xq/xs must be int8 / Q8_SCALE with nb rows of K")
    elif x.dtype != np.float32 or x.size < nb * K:
        raise MemraError(f"matvec: x must be f32 with >= {nb}x{K} values")
    # batches above the largest bucket: chunks of 8 rows (each chunk re-reads W); the f32
    # family on quantized weights exists at batch 1 only: one launch per row
    chunk = BUCKETS[-1] if q8 or w.ggml_type in FLOAT_TYPES else 1
    for b0 in range(0, nb, chunk):
        n = min(chunk, nb - b0)
        cfg = launch_config(w.ggml_type, q8, N, K, n, bool(glu), config, tuned)
        name = ("mv_q8" if q8 else "mv_f32") + ("_glu" if glu else "")
        k = _module(g, w.ggml_type, n, cfg, canary).kernel(name)
        yo = y.view(np.float32, (n * N,), 4 * b0 * N)
        ro = residual.view(np.float32, (n * N,), 4 * b0 * N) if residual is not None else _NULL
        if q8:
            act_args = (xq.view(np.int8, (n * K,), b0 * K), xs.view(Q8_SCALE, (n * K // 32,), 8 * b0 * K // 32))
        else:
            act_args = (x.view(np.float32, (n * K,), 4 * b0 * K),)
        shmem = xsmem_bytes(n, K) if q8 and cfg.get("MV_XSMEM") else 0
        g.launch(k, (grid_for(N, cfg),), (32 * cfg["MV_NWARPS"],),
                 (w.bulk, w.meta, *act_args, yo, ro, np.int32(N), np.int32(K), np.int32(n),
                  np.int32(ACTS[glu])), shmem=shmem, pdl=pdl)


# ---------------------------------------------------------------------------------------
# references (numpy)

def dequant_rows(data: np.ndarray, ggml_type: int) -> np.ndarray:
    from memra.model.quants import dequantize

    name, blk, bb, _, _ = TYPES[ggml_type]
    rows = data.shape[0]
    return dequantize(np.ascontiguousarray(data).reshape(-1), ggml_type,
                      (rows, data.shape[1] // bb * blk))


def glu_ref(y: np.ndarray, glu: str) -> np.ndarray:
    """float64 act(gate) * up of products y [nb, 2N] (gate the first N): the glu epilogue's reference."""
    n = y.shape[1] // 2
    gte, up = y[:, :n], y[:, n:]
    if glu == "silu":
        with np.errstate(over="ignore"):
            a = gte / (1.0 + np.exp(-gte))
    else:
        a = 0.5 * gte * (1.0 + np.tanh(0.7978845608028654 * (gte + 0.044715 * gte ** 3)))
    return a * up


def matvec_ref(wf: np.ndarray, xv: np.ndarray, residual=None, glu=None) -> np.ndarray:
    """float64 reference: wf [rows, K] (dequantized), xv [nb, K] -> [nb, N]."""
    y = np.asarray(xv, np.float64) @ np.asarray(wf, np.float64).T  # no copy of a float64 wf
    if glu:
        y = glu_ref(y, glu)
    if residual is not None:
        y = y + residual.astype(np.float64)
    return y


def random_weight(ggml_type: int, rows: int, K: int, rng: np.random.Generator) -> np.ndarray:
    """Random valid GGUF rows (rows, row_bytes): random quant bytes, finite f16 scales."""
    name, blk, bb, _, _ = TYPES[ggml_type]
    nblk = K // blk
    if ggml_type == 0:
        return rng.standard_normal((rows, K), np.float32).view(np.uint8)
    if ggml_type == 1:
        return rng.standard_normal((rows, K)).astype(np.float16).view(np.uint8)
    if ggml_type == 30:
        v = rng.standard_normal((rows, K)).astype(np.float32).view(np.uint32)
        return (v >> 16).astype(np.uint16).view(np.uint8)
    raw = rng.integers(0, 256, (rows, nblk, bb), dtype=np.uint8)
    for off in F16_FIELDS[ggml_type]:
        v = (rng.uniform(0.5, 1.5, (rows, nblk)) * rng.choice([-1, 1], (rows, nblk)) * 2.0 ** -6)
        raw[:, :, off:off + 2] = v.astype(np.float16).view(np.uint8).reshape(rows, nblk, 2)
    return raw.reshape(rows, nblk * bb)


# ---------------------------------------------------------------------------------------
# kernel-check

_CHECK_N, _CHECK_K = 203, 768


# shapes (N, K) whose default configs the checks run: the small check shape, and two that
# reach the large-K (split-K) and mid-K (8 warps, 2 rows) defaults
_CHECK_SHAPES = ((_CHECK_N, _CHECK_K), (96, 8192), (96, 2048))
_WIDE_TYPES = (12, 2, 8, 14, 1)


def _check_configs():
    """(type, bucket, config) of every default the checks launch."""
    seen = []
    for t in TYPES:
        shapes = _CHECK_SHAPES if t in _WIDE_TYPES else _CHECK_SHAPES[:1]
        for (n, k) in shapes:
            for b in BUCKETS:
                for path in (("f32",) if t in FLOAT_TYPES else ("q8", "f32") if b == 1 else ("q8",)):
                    for glu in (False, True):
                        item = (t, b, default_config(t, path, n, k, b, glu))
                        if item not in seen:
                            seen.append(item)
    return seen


def compile_variants() -> list[tuple[str, dict]]:
    out: list[tuple[str, dict]] = [(Q8_FILE, {"Q8_WARPS": Q8_WARPS}),
                                   (Q8_FILE, {"Q8_WARPS": Q8_WARPS, "MEMRA_CANARY": 2})]
    for t, b, cfg in _check_configs():
        out.append((KERNEL_FILE, {"MV_TYPE": t, "MV_B": b, **cfg}))
    out.append((KERNEL_FILE, {"MV_TYPE": 12, "MV_B": 4, **_ALT}))
    for t, b, cfg in _XS_RUNS:
        out.append((KERNEL_FILE, {"MV_TYPE": t, "MV_B": b, **cfg}))
    out.append((KERNEL_FILE, {"MV_TYPE": 12, "MV_B": 1, **_ALT}))
    out.append((KERNEL_FILE, {"MV_TYPE": 12, "MV_B": 1, **default_config(12, "q8", 96, 2048, 1),
                              "MV_PREFETCH": 0, "MV_PDL_TRIGGER": 0}))
    out.append((KERNEL_FILE, {"MV_TYPE": 12, "MV_B": 1, **default_config(12, "q8", _CHECK_N, _CHECK_K, 1),
                              "MEMRA_CANARY": 1}))
    out.append((KERNEL_FILE, {"MV_TYPE": 14, "MV_B": 1, **default_config(14, "f32", _CHECK_N, _CHECK_K, 1),
                              "MEMRA_CANARY": 1}))
    return out


# a second configuration exercised by the checks (split-K, 2 rows per warp, unroll 2)
_ALT = {"MV_NWARPS": 8, "MV_ROWS": 2, "MV_KSPLIT": 2, "MV_UNROLL": 2}
# activations staged in shared memory (q8 family); with and without split-K
_XS = {"MV_NWARPS": 8, "MV_ROWS": 2, "MV_KSPLIT": 1, "MV_UNROLL": 1, "MV_XSMEM": 1}
_XS_KS = {"MV_NWARPS": 8, "MV_ROWS": 1, "MV_KSPLIT": 2, "MV_UNROLL": 1, "MV_XSMEM": 1}
# (type, bucket, config) the XSMEM checks launch
_XS_RUNS = ((12, 1, _XS), (12, 4, _XS), (14, 1, _XS), (2, 8, _XS), (8, 1, _XS_KS))


class _Case:
    """One weight on the device plus fresh activations; runs a variant, returns Outcome."""

    def __init__(self, g, t, N, K, rng, glu=False, nb=1):
        self.g, self.t, self.N, self.K, self.nb, self.glu = g, t, N, K, nb, glu
        rows = 2 * N if glu else N
        self.raw = random_weight(t, rows, K, rng)
        self.wf = dequant_rows(self.raw, t)
        self.w = upload_weight(g, self.raw, t)
        self.x = rng.standard_normal((nb, K)).astype(np.float32) * np.float32(rng.uniform(0.5, 4))
        self.res = rng.standard_normal((nb, N)).astype(np.float32)
        self.xd = g.to_device(self.x)
        self.rd = g.to_device(self.res)
        self.y = g.empty((nb, N), np.float32)
        self.xq = g.empty((nb, K), np.int8)
        self.xs = g.empty((nb, K // 32), Q8_SCALE)
        qh, sh = quantize_q8_ref(self.x)
        self.xdeq = (qh.reshape(nb, -1, 32).astype(np.float64) * sh["d"][..., None]).reshape(nb, K)

    def run(self, name, path, b, act=None, residual=False, config=None, canary=0):
        from memra.gpu.compare import compare

        g = self.g
        self.y.poison()
        kw = dict(nb=self.nb, glu=act, residual=self.rd if residual else None, config=config,
                  canary=canary)
        if path == "q8":
            self.xq.poison()
            quantize_q8(g, self.xd, self.xq, self.xs, self.nb)
            matvec(g, self.w, self.y, xq=self.xq, xs=self.xs, **kw)
            ref = matvec_ref(self.wf, self.xdeq, self.res if residual else None, act)
        else:
            matvec(g, self.w, self.y, x=self.xd, **kw)
            ref = matvec_ref(self.wf, self.x, self.res if residual else None, act)
        g.sync()
        return compare(name, self.y.numpy(), ref, TOL)


def checks(g, rng) -> Iterator:
    from memra.gpu.compare import Outcome, compare

    # activation quantization: bit-exact
    B, K = 5, 1024
    x = rng.standard_normal((B, K)).astype(np.float32) * np.float32(3)
    x[1, 32:64] = 0.0   # an all-zero block (d = 0, q = 0)
    xd = g.to_device(x)
    xq, xs = g.empty((B, K), np.int8), g.empty((B, K // 32), Q8_SCALE)
    xq.poison(); xs.poison()
    quantize_q8(g, xd, xq, xs, B)
    g.sync()
    qr, sr = quantize_q8_ref(x)
    o1 = compare("quantize_q8 q", xq.numpy(), qr, 0, "exact")
    got = xs.numpy()
    o2 = compare("quantize_q8 d", got["d"].view(np.uint32), sr["d"].view(np.uint32), 0, "exact")
    o3 = compare("quantize_q8 s", got["s"], sr["s"], 0, "exact")
    yield Outcome("quantize_q8 B=5 K=1024", o1.ok and o2.ok and o3.ok,
                  f"q: {o1.detail}; d: {o2.detail}; s: {o3.detail}")

    N, K = _CHECK_N, _CHECK_K
    for t, (tname, *_r) in TYPES.items():
        for b, nb in ((1, 1), (4, 3), (8, 8)):
            paths = ("f32",) if t in FLOAT_TYPES else ("q8", "f32") if b == 1 else ("q8",)
            plain = _Case(g, t, N, K, rng, nb=nb)
            for path in paths:
                res = b == 4
                yield plain.run(f"{tname} {path} B{b} nb={nb}{' +res' if res else ''} {N}x{K}",
                                path, b, residual=res)
            if b != 4:
                act = "silu" if b == 1 else "gelu"
                gl = _Case(g, t, N, K, rng, glu=True, nb=nb)
                for path in paths:
                    yield gl.run(f"{tname} {path} glu-{act} B{b} nb={nb} 2x{N}x{K}", path, b, act=act)
    # the alternative configuration on a K-quant and a K large enough for several units/lane
    alt = _Case(g, 12, 77, 2048, rng, nb=4)
    yield alt.run(f"Q4_K q8 B4 nb=4 77x2048 {_ALT}", "q8", 4, residual=True, config=_ALT)
    alt = _Case(g, 12, 77, 2048, rng, nb=1)
    yield alt.run(f"Q4_K f32 B1 nb=1 77x2048 {_ALT}", "f32", 1, residual=True, config=_ALT)
    # the large-K and mid-K default configurations (and prefetch off, PDL trigger off)
    for t in _WIDE_TYPES:
        tname = TYPES[t][0]
        for (n, k) in _CHECK_SHAPES[1:]:
            for nb in (1, 5):
                c = _Case(g, t, n, k, rng, nb=nb)
                for path in (("f32",) if t in FLOAT_TYPES else ("q8", "f32") if nb == 1 else ("q8",)):
                    yield c.run(f"{tname} {path} nb={nb} {n}x{k}", path, nb)
    c = _Case(g, 12, 96, 2048, rng, nb=1)
    cfg = dict(default_config(12, "q8", 96, 2048, 1), MV_PREFETCH=0, MV_PDL_TRIGGER=0)
    yield c.run(f"Q4_K q8 B1 96x2048 {cfg}", "q8", 1, config=cfg)
    # activations staged in shared memory: partial last tile (K=768), several tiles, glu,
    # batch, split-K
    xs_cases = {(12, 1): (_CHECK_N, _CHECK_K, False, 1), (12, 4): (_CHECK_N, _CHECK_K, False, 3),
                (14, 1): (96, 8192, False, 1), (2, 8): (_CHECK_N, _CHECK_K, True, 8), (8, 1): (96, 2048, False, 1)}
    for t, b, cfg in _XS_RUNS:
        n, k, glu, nb = xs_cases[(t, b)]
        c = _Case(g, t, n, k, rng, glu=glu, nb=nb)
        yield c.run(f"{TYPES[t][0]} q8 B{b} nb={nb}{' glu-silu' if glu else ''} {n}x{k} {cfg}", "q8", b,
                    act="silu" if glu else None, residual=not glu, config=cfg)
    # f32 path on quantized weights at batch > 1 (one B=1 launch per row)
    c = _Case(g, 6, 64, 512, rng, nb=3)
    yield c.run("Q5_0 f32 nb=3 (row by row) 64x512", "f32", 1)


def canaries(g, rng) -> Iterator:
    from memra.gpu.compare import compare

    c = _Case(g, 12, _CHECK_N, _CHECK_K, rng, nb=1)
    yield c.run("Q4_K q8 B1 drops a unit", "q8", 1, canary=1)
    c = _Case(g, 14, _CHECK_N, _CHECK_K, rng, nb=1)
    yield c.run("Q6_K f32 B1 drops a unit", "f32", 1, canary=1)
    x = rng.standard_normal((2, 256)).astype(np.float32)
    xd = g.to_device(x)
    xq, xs = g.empty((2, 256), np.int8), g.empty((2, 8), Q8_SCALE)
    xq.poison()
    quantize_q8(g, xd, xq, xs, 2, canary=True)
    g.sync()
    yield compare("quantize_q8 truncates", xq.numpy(), quantize_q8_ref(x)[0], 0, "exact")


# ---------------------------------------------------------------------------------------
# the launch set (memra.tune.launches): a plan launch -> the module it loads, and its check

_LAUNCH_N = 259  # rows checked of a larger weight: a partial last block at every rows-per-block


def launch_cases(L, ctx) -> list[dict]:
    """The case of a plan launch of op "matvec" (a chunk of <= 8 rows) or "quantize": the
    entry point and defines the runner's launcher builds for it (runner._matvec: the table's
    tunables laid over default_config), the exact row count, the K it loops over and whether
    the engine aliases a residual with the output (attention output, down projection)."""
    if L.op == "quantize":
        b = launch_bucket(L.rows)
        return [{"file": Q8_FILE, "entry": "quantize_q8", "defines": q8_defines(L.config), "bucket": b,
                 "tag": f"K{int(L.shape['n'])}", "params": {"K": int(L.shape["n"]), "rows": b}}]
    t = type_id(L.shape["type"])
    glu, q8, n = L.args.get("glu"), bool(L.args.get("q8")), int(L.rows)
    rows, K = int(L.shape["rows"]), int(L.shape["cols"])
    N = rows // 2 if glu else rows
    cfg = launch_config(t, q8, N, K, n, bool(glu), None, lambda _n: L.config)
    res = bool(L.args.get("res"))
    return [{"file": KERNEL_FILE, "entry": ("mv_q8" if q8 else "mv_f32") + ("_glu" if glu else ""),
             "defines": module_defines(t, n, cfg), "bucket": n, "tag": f"K{K}" + (" res=y" if res else ""),
             "params": {"type": t, "N": N, "K": K, "nb": n, "glu": glu, "q8": q8, "res": res}}]


_LAUNCH_WEIGHTS: dict[tuple, tuple] = {}


def _launch_weight(g, t: int, N: int, K: int, glu, rng):
    """A random weight of N (glu: 2N) rows of K on the device and its float64 dequantization,
    kept for the next cases of the same shape (the launch set is sorted by module)."""
    key = (id(g), t, N, K, bool(glu))
    hit = _LAUNCH_WEIGHTS.get(key)
    if hit is None:
        if len(_LAUNCH_WEIGHTS) >= 4:
            _LAUNCH_WEIGHTS.pop(next(iter(_LAUNCH_WEIGHTS)))
        raw = random_weight(t, 2 * N if glu else N, K, rng)
        hit = _LAUNCH_WEIGHTS[key] = (upload_weight(g, raw, t), dequant_rows(raw, t))
    return hit


def check_launch(g, rng, case) -> "object":
    """Run the case's module on fresh inputs: the output poisoned, then again with the
    residual aliased to the output (y = y + W x, as the engine launches it), each against
    matvec_ref; quantize_q8 bit-exact against quantize_q8_ref."""
    from memra.gpu.compare import Outcome, compare

    p, d = case["params"], case["defines"]
    if case["entry"] == "quantize_q8":
        K, rows = p["K"], p["rows"]
        x = (rng.standard_normal((rows, K)) * rng.uniform(0.5, 4)).astype(np.float32)
        x[0, :32] = 0.0
        xq, xs = g.empty((rows, K), np.int8), g.empty((rows, K // 32), Q8_SCALE)
        xq.poison()
        xs.poison()
        quantize_q8(g, g.to_device(x), xq, xs, rows, config=d)
        g.sync()
        q, sc = quantize_q8_ref(x)
        got = xs.numpy()
        bad = (int(np.count_nonzero(xq.numpy() != q)), int(np.count_nonzero(got.view(np.uint8) != sc.view(np.uint8))))
        return Outcome(f"quantize_q8 rows={rows} K={K} {d}", not any(bad),
                       "bit-exact" if not any(bad) else f"{bad[0]} values, {bad[1]} scale bytes differ",
                       0.0 if not any(bad) else np.inf)
    t, K, nb, glu, q8 = p["type"], p["K"], p["nb"], p["glu"], p["q8"]
    N = p["N"] if p["N"] <= 1024 else _LAUNCH_N
    config = {k: v for k, v in d.items() if k not in ("MV_TYPE", "MV_B")}
    w, wf = _launch_weight(g, t, N, K, glu, rng)
    x = (rng.standard_normal((nb, K)) * rng.uniform(0.5, 4)).astype(np.float32)
    if q8:
        xq, xs = g.empty((nb, K), np.int8), g.empty((nb, K // 32), Q8_SCALE)
        quantize_q8(g, g.to_device(x), xq, xs, nb)
        qh, sh = quantize_q8_ref(x)
        xv = (qh.reshape(nb, -1, 32).astype(np.float64) * sh["d"][..., None]).reshape(nb, K)
        act = dict(xq=xq, xs=xs)
    else:
        xv, act = x, dict(x=g.to_device(x))
    name = f"{case['entry']} {TYPES[t][0]} nb={nb} {N}x{K} {config}"
    y = g.empty((nb, N), np.float32)
    y.poison()
    matvec(g, w, y, nb=nb, glu=glu, config=config, **act)
    g.sync()
    o = compare(name, y.numpy(), matvec_ref(wf, xv, None, glu), TOL)
    if not o.ok:
        return o
    res = rng.standard_normal((nb, N)).astype(np.float32)
    y = g.to_device(res)  # the engine's aliasing: the output is the residual it adds to
    matvec(g, w, y, nb=nb, glu=glu, config=config, residual=y, **act)
    g.sync()
    o2 = compare(name + " res=y", y.numpy(), matvec_ref(wf, xv, res, glu), TOL)
    if not o2.ok:
        return o2
    return Outcome(name, True, f"{o.detail}; residual aliased to y: {o2.detail}", max(o.err, o2.err))


# ---------------------------------------------------------------------------------------
# tune hook (memra/tune/measure.py): kernel "matvec" | "matvec_glu", variant "q8" | "f32"

# the kernels tune_case measures and their variants (memra tune run checks a campaign's names against them)
TUNE_VARIANTS = {"matvec": ("q8", "f32"), "matvec_glu": ("q8", "f32")}


def tune_case(g, kernel: str, variant: str, config: dict, shape: dict, rng, rotate_bytes: int):
    if variant not in TUNE_VARIANTS.get(kernel, ()):
        raise MemraError(f"matvec tune: unknown kernel/variant {kernel}/{variant}")
    t = type_id(shape["type"])
    if variant == "q8" and t in FLOAT_TYPES:
        raise MemraError(f"variant q8 does not support type {shape['type']}")
    if variant == "f32" and t not in FLOAT_TYPES and int(shape.get("batch", 1)) > 1:
        raise MemraError(f"variant f32 runs {shape['type']} at batch 1 only")
    return _TuneCase(g, kernel == "matvec_glu", variant, t, int(shape["rows"]), int(shape["cols"]),
                     int(shape.get("batch", 1)), config, rng, rotate_bytes)


def _tune_config(t: int, variant: str, rows: int, K: int, nb: int, glu: bool, config: dict | None) -> dict:
    """The launch configuration of a tune job: the built-in default with the job's MV_*
    tunables laid over it (what the engine launches for a table entry, too)."""
    cfg = default_config(t, variant, rows // 2 if glu else rows, K, nb, glu)
    cfg.update({k: int(v) for k, v in (config or {}).items() if k.startswith("MV_")})
    return cfg


def is_builtin(kernel: str, variant: str, config: dict, shape: dict) -> bool:
    """Whether a tune job's configuration is what the launcher runs without a table."""
    t, nb = type_id(shape["type"]), int(shape.get("batch", 1))
    rows, K, glu = int(shape["rows"]), int(shape["cols"]), kernel == "matvec_glu"
    return _tune_config(t, variant, rows, K, nb, glu, config) == \
        default_config(t, variant, rows // 2 if glu else rows, K, nb, glu)


def tune_modules(kernel: str, variant: str, config: dict, shape: dict) -> list[tuple[str, dict]]:
    """(kernel file, defines) of every module a tune job loads: `memra tune run` compiles a
    campaign's modules in parallel processes before timing (NVRTC takes ~1 s per matvec
    module; one process would spend most of a campaign compiling)."""
    t, nb = type_id(shape["type"]), int(shape.get("batch", 1))
    cfg = _tune_config(t, variant, int(shape["rows"]), int(shape["cols"]), nb, kernel == "matvec_glu", config)
    return [(KERNEL_FILE, {"MV_TYPE": t, "MV_B": bucket(nb), **cfg}), (Q8_FILE, {"Q8_WARPS": Q8_WARPS})]


# The weights of the shape being tuned: every configuration of a shape (a campaign's jobs
# come shape by shape) reuses its random weight, device copies and float64 dequantization
# (seconds for a 128256 x 4096 Q6_K head); each check still draws fresh activations. One
# shape is kept at a time, so the previous one's device memory is freed.
_SHAPE_CACHE: dict[tuple, tuple] = {}


def _shape_weights(g, t: int, rows: int, K: int, rng, rotate_bytes: int, raw: bool = False, dequant: bool = True):
    """(weight copies, float64 dequantized weight) of a random weight of this shape; raw: and
    its GGUF rows (memra.gpu.ops.gemm_tile's chain reference). dequant=False: None for the float64
    copy, made only when a caller asks for it (the 8B head's would be 4.2 GB; qf's tune check takes
    its reference rows from the GGUF rows)."""
    key = (id(g), t, rows, K, rotate_bytes)
    hit = _SHAPE_CACHE.get(key)
    if hit is None:
        _SHAPE_CACHE.clear()
        r = random_weight(t, rows, K, rng)
        w0 = upload_weight(g, r, t)
        sets = max(1, -(-rotate_bytes // w0.nbytes))
        # the other copies hold the same bytes: only their addresses matter (L2 rotation)
        ws = [w0] + [upload_weight(g, r, t) for _ in range(sets - 1)]
        hit = _SHAPE_CACHE[key] = [ws, None, r]
    if dequant and hit[1] is None:
        hit[1] = dequant_rows(hit[2], t).astype(np.float64)
    return tuple(hit) if raw else tuple(hit[:2])


class _TuneCase:
    def __init__(self, g, glu, variant, t, rows, K, nb, config, rng, rotate_bytes):
        cfg = _tune_config(t, variant, rows, K, nb, glu, config)
        self.g, self.glu, self.variant, self.t, self.nb, self.cfg = g, glu, variant, t, nb, cfg
        self.N = rows // 2 if glu else rows
        self.K = K
        self.ws, self.wf = _shape_weights(g, t, rows, K, rng, rotate_bytes)
        w0 = self.ws[0]
        self.sets = len(self.ws)
        self.x = rng.standard_normal((nb, K)).astype(np.float32)
        self.xd = g.to_device(self.x)
        self.xq = g.empty((nb, K), np.int8)
        self.xs = g.empty((nb, K // 32), Q8_SCALE)
        self.y = g.empty((nb, self.N), np.float32)
        quantize_q8(g, self.xd, self.xq, self.xs, nb)
        self.bytes = w0.nbytes + nb * (K * (1 if variant == "q8" else 4) + self.N * 4)

    def launch(self, i: int) -> None:
        act = "silu" if self.glu else None
        if self.variant == "q8":
            matvec(self.g, self.ws[i % self.sets], self.y, xq=self.xq, xs=self.xs, nb=self.nb,
                   glu=act, config=self.cfg)
        else:
            matvec(self.g, self.ws[i % self.sets], self.y, x=self.xd, nb=self.nb, glu=act,
                   config=self.cfg)

    def check(self):
        self.y.poison()
        self.launch(0)
        self.g.sync()
        wf = self.wf
        if self.variant == "q8":
            q, s = quantize_q8_ref(self.x)
            xv = (q.reshape(self.nb, -1, 32).astype(np.float64) * s["d"][..., None]).reshape(self.nb, -1)
        else:
            xv = self.x
        ref = matvec_ref(wf, xv, None, "silu" if self.glu else None)
        from memra.gpu.compare import compare

        o = compare("matvec", self.y.numpy(), ref, TOL)
        err = o.err
        return o.ok, err, o.detail
