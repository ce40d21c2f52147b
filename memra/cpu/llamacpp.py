"""llama.cpp CPU's float operations in its own order: the "llamacpp" numerics of the CPU
reference (memra/cpu/reference.py), as the AVX2 build in PyPI's xllamacpp (a fixed x86-64 +
AVX2/FMA/F16C build, whatever the host CPU) computes them:

  activations rounded per the weight type's vec_dot_type (q8_0 / q8_1 / q8_K) and the integer
  dot products' lane order and float accumulation of each kernel it runs (vec_dot, llamafile
  sgemm, the repacked Q4_K gemv/gemm, the tiled Q6_K matmul for 8+ rows), f16 KV cache,
  per-row flash attention (f16 Q, AVX2 f16 dot order, libm expf, f16 accumulator, split-KV
  merge for decode over 512+ cells), ggml's SIMD expf in SwiGLU, its f16 GELU table, rms_norm,
  and rope (libm sinf/cosf, its FMA contraction).

A q8_0 KV cache (--cache-type-k/-v q8_0): q8_0_quantize when a row is written and
attention_quant_kv (llama.cpp's per-row flash attention over a quantized K and/or V).

Fed llama.cpp's batches (tests/test_parity_models.py), the reference's logits come out
bit-identical to the wheel's on SmolLM2 Q4_1 and Gemma-3 Q4_K_M (experiments/llamacpp_dump).
Not emulated bit for bit: the tiled flash attention of 64+ query batches (a float32 softmax
instead), the cell order of a sliding-window cache once cells are reused, and the kernels of
other K-quants and IQ types (their q8_K rounding only). The test extra pins the verified
xllamacpp build: another build may run other kernels.
"""

from __future__ import annotations

import numba
import numpy as np

from memra.errors import MemraError
from memra.model.quants import Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL


def rms_norm_ggml(x: np.ndarray, w: np.ndarray | None, eps: float) -> np.ndarray:
    """ggml's CPU rms_norm: the float32 squares summed in double, mean rounded to float32,
    scale = 1/sqrtf(mean + eps), then x * scale (* w)."""
    x = np.asarray(x, np.float32)
    ss = np.sum(np.square(x).astype(np.float64), axis=-1, keepdims=True)
    mean = (ss / x.shape[-1]).astype(np.float32)
    y = x * (np.float32(1.0) / np.sqrt(mean + np.float32(eps)))
    return y * w if w is not None else y


def rope_ggml(x: np.ndarray, pos: np.ndarray, base: float, freq_scale: float, rope_dim: int,
              freq_factors, neox: bool) -> np.ndarray:
    """ggml's CPU rope (f32), bit for bit: theta_scale = powf(base, -2/n_dims), per position
    theta_i = p * theta_scale^i by repeated float32 products, glibc's cosf/sinf of
    freq_scale * (theta / factor); the rotation as the AVX2 build compiles it (the x1 products
    rounded, the x0 products fused into them: fma(x0, c, -x1*s), fma(x0, s, x1*c))."""
    x = np.ascontiguousarray(x, np.float32)
    ff = np.ones(x.shape[-1] // 2, np.float32) if freq_factors is None else np.asarray(freq_factors, np.float32)
    out = x.copy()
    _rope_ggml_nb(x, np.asarray(pos, np.int64), np.float32(base), np.float32(freq_scale), rope_dim, ff,
                  freq_factors is not None, neox, out)
    return out


@numba.njit(cache=True)
def _rope_ggml_nb(x, pos, base, freq_scale, n_dims, ff, has_ff, neox, out):  # pragma: no cover
    T, H, D = x.shape
    ts = np.float32(base ** np.float32(np.float32(-2.0) / np.float32(n_dims)))  # powf
    half = n_dims // 2
    cs = np.empty(D // 2, np.float32)
    sn = np.empty(D // 2, np.float32)
    for t in range(T):
        theta = np.float32(pos[t])
        for i in range(D // 2):
            th = theta / ff[i] if has_ff else theta
            th = np.float32(freq_scale * th)
            cs[i] = np.cos(th)
            sn[i] = np.sin(th)
            theta = np.float32(theta * ts)
        for h in range(H):
            for i in range(half):
                if neox:
                    a, b = i, i + half
                else:
                    a, b = 2 * i, 2 * i + 1
                x0 = np.float64(x[t, h, a])
                x1 = x[t, h, b]
                c = np.float64(cs[i])
                s = np.float64(sn[i])
                out[t, h, a] = np.float32(x0 * c - np.float64(np.float32(x1 * sn[i])))
                out[t, h, b] = np.float32(x0 * s + np.float64(np.float32(x1 * cs[i])))


@numba.njit(cache=True, inline="always")
def _f16r(x):  # pragma: no cover (compiled)
    """float32 -> the nearest f16 value (half to even, F16C's vcvtps2ph), as float32."""
    ax = abs(x)
    if not ax < np.float32(65520.0):  # rounds to inf (nan stays nan)
        return x if ax != ax else (np.float32(np.inf) if x > 0 else np.float32(-np.inf))
    e = np.int32((np.float32(x).view(np.int32) >> 23) & 0xFF) - 127
    if e < -14:
        e = np.int32(-14)
    ulp = np.float64(2.0) ** (e - 10)
    return np.float32(np.rint(np.float64(x) / ulp) * ulp)


def _fhex(s: str) -> np.float32:
    return np.float32(float.fromhex(s))


_EXP_C = np.array([_fhex(s) for s in ("0x1.8p23", "0x1.715476p+0", "0x1.7f7d1cp-20", "0x1.62e4p-1",
                                      "0x1.0e4020p-7", "0x1.573e2ep-5", "0x1.555e66p-3", "0x1.fffdb6p-2",
                                      "0x1.ffffecp-1")], np.float32)


@numba.njit(cache=True, inline="always")
def _fma(a, b, c):  # pragma: no cover (compiled)
    """float32 fused multiply-add (the product is exact in float64; one rounding but for the
    rare float64 tie that double rounding can break)."""
    return np.float32(np.float64(a) * np.float64(b) + np.float64(c))


@numba.njit(cache=True)
def _v_expf(x, C):  # pragma: no cover (compiled)
    """One lane of ggml's AVX2 ggml_v_expf (an FMA polynomial, not libm's expf)."""
    z = _fma(x, C[1], C[0])
    n = np.float32(z - C[0])
    b = _fma(-n, C[2], _fma(-n, C[3], x))
    e = np.int32(z.view(np.int32) << 23)
    k = np.int32(e + np.float32(1.0).view(np.int32)).view(np.float32)
    u = np.float32(b * b)
    j = _fma(_fma(_fma(C[4], b, C[5]), u, _fma(C[6], b, C[7])), u, np.float32(C[8] * b))
    if not abs(n) > np.float32(126.0):
        return _fma(j, k, k)
    g = np.int32(0x82000000 - (1 << 32)) if n <= np.float32(0.0) else np.int32(0)
    s1 = np.int32(g + np.int32(0x7f000000)).view(np.float32)
    s2 = np.int32(e - g).view(np.float32)
    if abs(n) > np.float32(192.0):
        return np.float32(s1 * s1)
    return np.float32(_fma(s2, j, s2) * s1)


@numba.njit(cache=True)
def _swiglu_ggml_nb(gate, up, C, out):  # pragma: no cover (compiled)
    rows, n = gate.shape
    nv = n - n % 8
    for r in range(rows):
        for i in range(n):
            x = gate[r, i]
            if i < nv:  # ggml_v_silu: x / (1 + v_expf(0 - x))
                s = np.float32(x / np.float32(np.float32(1.0) + _v_expf(np.float32(np.float32(0.0) - x), C)))
            else:  # the scalar tail: ggml_silu_f32 with libm's expf
                s = np.float32(x / np.float32(np.float32(1.0) + np.exp(-x)))
            out[r, i] = np.float32(s * up[r, i])


def swiglu_ggml(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    """ggml's CPU swiglu (AVX2): silu(gate) * up with its SIMD expf on whole 8-lane vectors."""
    gate = np.ascontiguousarray(gate, np.float32)
    up = np.ascontiguousarray(up, np.float32)
    out = np.empty_like(gate)
    _swiglu_ggml_nb(gate.reshape(-1, gate.shape[-1]), up.reshape(-1, up.shape[-1]), _EXP_C,
                    out.reshape(-1, out.shape[-1]))
    return out


_GELU_TABLE = None


@numba.njit(cache=True)
def _gelu_table_nb(h):  # pragma: no cover (compiled)
    """ggml_cpu_init's table: gelu(h) as the AVX2 build compiles ggml_gelu_f32 (fma(A*x, x, 1),
    libm's tanhf), then rounded to f16."""
    A = np.float32(0.044715)
    S2 = np.float32(0.79788456080286535587989211986876)
    out = np.empty_like(h)
    for i in range(h.shape[0]):
        x = h[i]
        inner = _fma(np.float32(x * A), x, np.float32(1.0))
        t = np.tanh(np.float32(np.float32(x * S2) * inner))
        out[i] = _f16r(np.float32(np.float32(x * np.float32(0.5)) * np.float32(t + np.float32(1.0))))
    return out


def _gelu_table() -> np.ndarray:
    global _GELU_TABLE
    if _GELU_TABLE is None:
        h = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(np.float32)
        with np.errstate(over="ignore", invalid="ignore"):
            _GELU_TABLE = _gelu_table_nb(h)
    return _GELU_TABLE


def gelu_f16_table(x: np.ndarray) -> np.ndarray:
    """llama.cpp CPU's GELU (GGML_GELU_FP16): x <= -10 -> 0, x >= 10 -> x, else a table of
    f16(gelu(h)) looked up at h = f16(x)."""
    x = np.asarray(x, np.float32)
    y = _gelu_table()[x.astype(np.float16).view(np.uint16)]
    return np.where(x <= -10, np.float32(0), np.where(x >= 10, x, y)).astype(np.float32)


def geglu_ggml(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    """ggml's CPU geglu (GGML_GELU_FP16): 0 where gate <= -10, gate * up where gate >= 10,
    else table(f16(gate)) * up."""
    gate = np.asarray(gate, np.float32)
    y = _gelu_table()[gate.astype(np.float16).view(np.uint16)] * up
    return np.where(gate <= -10, np.float32(0), np.where(gate >= 10, gate * up, y)).astype(np.float32)


@numba.njit(parallel=True, cache=True)
def q8_dot_matvec(q, scale, minv, qa, da, sa, out):  # pragma: no cover (compiled)
    """llama.cpp's AVX2 ggml_vec_dot_{q4_0,q4_1,q5_0,q5_1,q8_0}_q8_{0,1} for every row of a
    32-block weight (codes q, f16 scale, f16 min) and int8 activations qa with f16 scales da
    (q8_1: stored sums sa): per block, 8 lanes of exact 4-element integer sums, each lane
    acc = fma(d_w * d_x, sum, acc); the min term m * s summed separately; then the 8 lanes
    reduced as hsum_float_8 does ((hi + lo) pairwise), plus the min sum."""
    rows, cols = q.shape
    nb = cols // 32
    has_min = minv.shape[0] > 0
    for r in numba.prange(rows):
        for t in range(qa.shape[0]):
            acc = np.zeros(8, np.float32)
            summs = np.float32(0.0)
            for b in range(nb):
                d = np.float32(scale[r, b] * da[t, b])
                base = b * 32
                for j in range(8):
                    xy = 0
                    for k in range(4):
                        xy += np.int32(q[r, base + 4 * j + k]) * np.int32(qa[t, base + 4 * j + k])
                    acc[j] = np.float32(np.float64(d) * np.float64(xy) + np.float64(acc[j]))
                if has_min:
                    summs = np.float32(np.float64(minv[r, b]) * np.float64(sa[t, b]) + np.float64(summs))
            r0 = np.float32(acc[4] + acc[0])
            r1 = np.float32(acc[5] + acc[1])
            r2 = np.float32(acc[6] + acc[2])
            r3 = np.float32(acc[7] + acc[3])
            out[t, r] = np.float32(np.float32(np.float32(r0 + r2) + np.float32(r1 + r3)) + summs)


@numba.njit(cache=True)
def _q8_k_nb(x, q, d, bsum):  # pragma: no cover (compiled)
    """quantize_row_q8_K: per 256, the value of largest magnitude m (the first), iscale =
    -127/m, q = min(127, rint(iscale * x)), d = 1/iscale, bsums of 16."""
    n, k = x.shape
    for t in range(n):
        for b in range(k // 256):
            o = b * 256
            amax = np.float32(0.0)
            mx = np.float32(0.0)
            for j in range(256):
                ax = abs(x[t, o + j])
                if ax > amax:
                    amax = ax
                    mx = x[t, o + j]
            if amax == 0:
                d[t, b] = 0
                for j in range(256):
                    q[t, o + j] = 0
            else:
                iscale = np.float32(np.float32(-127.0) / mx)
                for j in range(256):
                    v = np.rint(np.float32(iscale * x[t, o + j]))
                    q[t, o + j] = min(127, np.int32(v))
                d[t, b] = np.float32(np.float32(1.0) / iscale)
            for g in range(16):
                sm = 0
                for j in range(16):
                    sm += q[t, o + 16 * g + j]
                bsum[t, b * 16 + g] = sm


def q8_k_blocks(x: np.ndarray):
    """llama.cpp's q8_K activation blocks: int8 q [n, k], float32 d [n, k/256], bsums [n, k/16]."""
    x = np.ascontiguousarray(split_blocks(x, 256).reshape(x.shape), np.float32)
    n, k = x.shape
    q = np.empty((n, k), np.int8)
    d = np.empty((n, k // 256), np.float32)
    bsum = np.empty((n, k // 16), np.int32)
    _q8_k_nb(x, q, d, bsum)
    return q, d, bsum


@numba.njit(parallel=True, cache=True)
def q4_k_dot(q4, sc, mn, dw, dmw, qa, da, bsum, gemm_rows, out):  # pragma: no cover (compiled)
    """llama.cpp's repacked Q4_K x q8_K kernels (AVX2). gemv (one activation row): per
    256-superblock one exact integer sum_s sc_s * <q4, q8>_s and one sum_s m_s * bsum_s, each
    accumulated as acc = fma(float(int), d_w * d_x, acc). gemm (the first gemm_rows rows, a
    multiple of 4): the same per pair of 32-sub-blocks. The output is acc - acc_min."""
    rows, k = q4.shape
    nb = k // 256
    for r in numba.prange(rows):
        for t in range(qa.shape[0]):
            step = 2 if t < gemm_rows else 8  # sub-blocks per float accumulation
            acc = np.float32(0.0)
            accm = np.float32(0.0)
            for b in range(nb):
                dd = np.float32(dw[r, b] * da[t, b])
                dm = np.float32(dmw[r, b] * da[t, b])
                for s0 in range(0, 8, step):
                    isum = 0
                    imin = 0
                    for s_ in range(s0, s0 + step):
                        o = b * 256 + s_ * 32
                        dot = 0
                        for e in range(32):
                            dot += np.int32(q4[r, o + e]) * np.int32(qa[t, o + e])
                        isum += np.int32(sc[r, b * 8 + s_]) * dot
                        imin += np.int32(mn[r, b * 8 + s_]) * (bsum[t, b * 16 + 2 * s_] + bsum[t, b * 16 + 2 * s_ + 1])
                    acc = _fma(np.float32(isum), dd, acc)
                    accm = _fma(np.float32(imin), dm, accm)
            out[t, r] = np.float32(acc - accm)


@numba.njit(parallel=True, cache=True)
def q6_k_dot(q6, sc, dw, qa, da, bsum, tiled, out):  # pragma: no cover (compiled)
    """Q6_K x q8_K as llama.cpp's AVX2 build computes it.
    vec_dot (ggml_vec_dot_q6_K_q8_K): per 256-superblock 8 integer lanes, lane l summing
    sc * q6 * q8 over bytes 4l..4l+3 of every 32 (q6 unsigned, 0..63) less 32 * sc * bsum over
    the two 16-groups 2l, 2l+1; acc_l = fma(d_x * d_w, float(lane), acc_l); hsum_float_8.
    tiled (batches of 8 rows or more, ggml-cpu/tiled): per superblock the exact integer
    S = sum sc * (q6 - 32) * q8, acc = fma(d_w * float(S), d_x, acc)."""
    rows, k = q6.shape
    nb = k // 256
    for r in numba.prange(rows):
        lane = np.zeros(8, np.int64)
        acc = np.zeros(8, np.float32)
        for t in range(qa.shape[0]):
            if tiled:
                a = np.float32(0.0)
                for b in range(nb):
                    o = b * 256
                    S = 0
                    for g in range(16):
                        dot = 0
                        for e in range(16):
                            dot += (np.int32(q6[r, o + 16 * g + e]) - 32) * np.int32(qa[t, o + 16 * g + e])
                        S += np.int32(sc[r, b * 16 + g]) * dot
                    a = _fma(np.float32(dw[r, b] * np.float32(S)), da[t, b], a)
                out[t, r] = a
                continue
            acc[:] = 0
            for b in range(nb):
                lane[:] = 0
                o = b * 256
                for e in range(256):
                    lane[(e % 32) // 4] += np.int32(sc[r, b * 16 + e // 16]) * np.int32(q6[r, o + e]) * np.int32(qa[t, o + e])
                for l in range(8):
                    lane[l] -= 32 * (np.int32(sc[r, b * 16 + 2 * l]) * bsum[t, b * 16 + 2 * l]
                                     + np.int32(sc[r, b * 16 + 2 * l + 1]) * bsum[t, b * 16 + 2 * l + 1])
                d = np.float32(da[t, b] * dw[r, b])
                for l in range(8):
                    acc[l] = _fma(d, np.float32(np.int32(lane[l])), acc[l])
            r0 = np.float32(acc[4] + acc[0])
            r1 = np.float32(acc[5] + acc[1])
            r2 = np.float32(acc[6] + acc[2])
            r3 = np.float32(acc[7] + acc[3])
            out[t, r] = np.float32(np.float32(r0 + r2) + np.float32(r1 + r3))


def _k_blocks(t, block_bytes: int) -> np.ndarray:
    rows, cols = t.shape
    return np.ascontiguousarray(t.data).reshape(rows, cols // 256, block_bytes)


def parse_q4_k(t):
    """A Q4_K tensor's raw parts: codes 0..15 [rows, cols] in element order, 6-bit scales and
    mins [rows, cols/32], f16 d and dmin as float32 [rows, cols/256]."""
    from memra.model.quants import _f16, _k4_scales
    b = _k_blocks(t, 144)
    rows, nb, _ = b.shape
    flat = b.reshape(rows * nb, 144)
    d, dmin = _f16(flat[:, 0:2]), _f16(flat[:, 2:4])
    sc, mn = _k4_scales(flat[:, 4:16])
    qs = flat[:, 16:144].reshape(-1, 4, 1, 32)
    q = ((qs >> np.array([0, 4], np.uint8).reshape(1, 1, 2, 1)) & 0x0F).reshape(rows, nb * 256)
    return (np.ascontiguousarray(q, np.uint8), sc.astype(np.uint8).reshape(rows, nb * 8),
            mn.astype(np.uint8).reshape(rows, nb * 8), d.reshape(rows, nb), dmin.reshape(rows, nb))


def parse_q6_k(t):
    """A Q6_K tensor's raw parts: unsigned codes 0..63 [rows, cols], int8 scales [rows, cols/16],
    f16 d as float32 [rows, cols/256]."""
    from memra.model.quants import _f16
    b = _k_blocks(t, 210)
    rows, nb, _ = b.shape
    flat = b.reshape(rows * nb, 210)
    ql = flat[:, 0:128].reshape(-1, 2, 1, 64)
    qh = flat[:, 128:192].reshape(-1, 2, 1, 32)
    low = ((ql >> np.array([0, 4], np.uint8).reshape(1, 1, 2, 1)) & 0x0F).reshape(-1, 2, 4, 32)
    high = (qh >> (np.arange(4, dtype=np.uint8) * 2).reshape(1, 1, 4, 1)) & 3
    q = (low | (high << 4)).reshape(rows, nb * 256).astype(np.uint8)
    sc = flat[:, 192:208].view(np.int8).reshape(rows, nb * 16)
    d = _f16(flat[:, 208:210]).reshape(rows, nb)
    return np.ascontiguousarray(q), np.ascontiguousarray(sc), d


def round_f16(x: np.ndarray) -> np.ndarray:
    """float32 -> nearest f16 (half to even, as F16C) -> float32."""
    return np.asarray(x, np.float32).astype(np.float16).astype(np.float32)


def split_blocks(x: np.ndarray, n: int) -> np.ndarray:
    x = np.asarray(x, np.float32)
    if x.shape[-1] % n:
        raise MemraError(f"activation rows of {x.shape[-1]} values are not whole blocks of {n}")
    return x.reshape(*x.shape[:-1], x.shape[-1] // n, n)


def q8_llamacpp(x: np.ndarray, with_sum: bool = False):
    """llama.cpp CPU's quantize_row_q8_0 / q8_1 (the AVX2 build xllamacpp ships): per 32,
    id = 127/amax, q = round-half-even(x * id), d stored as f16. Returns (x_hat [.., n],
    the f16 d [.., n/32], and for q8_1 the f16 s = d * sum(q) it stores [.., n/32])."""
    xb = split_blocks(x, 32)
    amax = np.max(np.abs(xb), axis=-1)
    d = amax / np.float32(127)
    with np.errstate(divide="ignore"):
        inv = np.where(amax != 0, np.float32(127) / amax, np.float32(0)).astype(np.float32)
    q = np.rint(xb * inv[..., None])
    d16 = round_f16(d)
    xh = (q * d16[..., None]).reshape(x.shape)
    s16 = round_f16(d * q.sum(axis=-1)) if with_sum else None
    return xh, d16, q, s16


def q8_0_quantize(x: np.ndarray):
    """x [..., n] (n a multiple of 32) as q8_0 blocks, llama.cpp CPU's quantize_row_q8_0 as the
    AVX2 build computes it (the from_float its set_rows uses to write a q8_0 KV cache, and its
    flash attention to convert Q for a q8_0 K): per 32 consecutive values, in float32,
        amax = max |x|;  d = f16(amax / 127)  (the quotient rounded to float32, then to f16
        half to even);  id = 127 / amax (float32; 0 when amax = 0);
        q = round-half-even(float32(x * id))   (|q| <= 127: |x * id| <= 127 rounds to at most
                                                 127, so no clamp is ever reached)
    id comes from amax, not from the f16 d, and the rounding is half to even (_mm256_round_ps),
    unlike ggml's portable quantize_row_q8_0_ref (id = 1/d, roundf: half away from zero).
    One corner as the kernel has it: where id overflows to inf (amax < 127 / FLT_MAX, about
    3.7e-37) x * id is not finite and the int conversion's saturation stores q = -128.
    Returns int8 q [..., n] and float32 d [..., n/32] (f16 values)."""
    xb = split_blocks(x, 32)
    amax = np.max(np.abs(xb), axis=-1)
    d16 = round_f16(amax / np.float32(127))
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        inv = np.where(amax != 0, np.float32(127) / amax, np.float32(0)).astype(np.float32)
        y = xb * inv[..., None]
        q = np.where(np.isfinite(y), np.rint(y), np.float32(-128))
    return q.reshape(np.shape(x)).astype(np.int8), d16.astype(np.float32)


def q8_0_dequantize(q: np.ndarray, d: np.ndarray) -> np.ndarray:
    """float32(d) * q per 32 (dequantize_row_q8_0: exact, an f16 times an 8-bit integer)."""
    qb = np.asarray(q).reshape(*np.shape(q)[:-1], np.shape(q)[-1] // 32, 32).astype(np.float32)
    return (qb * np.asarray(d, np.float32)[..., None]).reshape(np.shape(q))


def q8_0_round_trip(x: np.ndarray) -> np.ndarray:
    """x's values as a q8_0 cache holds them: q8_0_dequantize(*q8_0_quantize(x))."""
    return q8_0_dequantize(*q8_0_quantize(x))


def q8_k_llamacpp(x: np.ndarray) -> np.ndarray:
    """ggml quantize_row_q8_K(_ref): per 256, max = the signed value of largest magnitude
    (first one), iscale = -127/max, q = min(127, nearest_int(iscale * x)), d = 1/iscale (f32)."""
    xb = split_blocks(x, 256)
    idx = np.argmax(np.abs(xb), axis=-1)
    mx = np.take_along_axis(xb, idx[..., None], axis=-1)
    with np.errstate(divide="ignore"):
        iscale = np.where(mx != 0, np.float32(-127) / mx, np.float32(0)).astype(np.float32)
        d = np.where(mx != 0, np.float32(1) / iscale, np.float32(0)).astype(np.float32)
    q = np.minimum(np.rint(iscale * xb), np.float32(127))
    return (q * d).reshape(x.shape)


# llama.cpp CPU: the activation format each weight type's dot product wants (vec_dot_type)
Q8_0_ACT_TYPES = frozenset({Q4_0, Q5_0, Q8_0, IQ4_NL})


Q8_1_ACT_TYPES = frozenset({Q4_1, Q5_1})


# llama.cpp CPU flash attention: batches of fewer queries than this run the per-row path
# (f16 Q, f16 output accumulator); larger ones run tiles in float32
FA_TILE_Q = 64


def attention_f16_acc(q, pos, kc, vc, n_gqa, window, scale, n_kv: int = 256, n_split: int = 1):
    """llama.cpp CPU's per-row flash attention (ggml_compute_forward_flash_attn_ext_f16_one_chunk)
    over an f16 KV cache (kc, vc: [n_head_kv, n_ctx, hd], f16 values): see _fa_rows_nb.
    q [n, n_head, hd]; returns [n, n_head * hd_v]."""
    n, n_head, _ = q.shape
    out = np.empty((n, n_head, vc.shape[2]), np.float32)
    _fa_rows_nb(np.ascontiguousarray(q, np.float32), np.asarray(pos, np.int64),
                np.ascontiguousarray(kc, np.float32), np.ascontiguousarray(vc, np.float32), n_gqa, window,
                np.float32(scale), n_kv, n_split, out)
    return out.reshape(n, n_head * vc.shape[2])


@numba.njit(cache=True, inline="always")
def _dot_f16_avx2(a, b):  # pragma: no cover (compiled)
    """ggml_vec_dot_f16 (AVX2): 4 x 8 float32 lanes of fused products over steps of 32, the
    arrays added pairwise (0+2, 1+3, then 0+1), lanes l + l+4, then two horizontal adds;
    leftovers added in double."""
    n = a.shape[0]
    np_ = n - n % 32
    acc = np.zeros(32, np.float32)
    for i in range(0, np_, 32):
        for l in range(32):
            acc[l] = np.float32(acc[l] + np.float32(a[i + l] * b[i + l]))  # f16 x f16 is exact
    for l in range(8):
        acc[l] = np.float32(acc[l] + acc[16 + l])
        acc[8 + l] = np.float32(acc[8 + l] + acc[24 + l])
    for l in range(8):
        acc[l] = np.float32(acc[l] + acc[8 + l])
    t0 = np.float32(acc[0] + acc[4])
    t1 = np.float32(acc[1] + acc[5])
    t2 = np.float32(acc[2] + acc[6])
    t3 = np.float32(acc[3] + acc[7])
    s = np.float64(np.float32(np.float32(t0 + t1) + np.float32(t2 + t3)))
    for i in range(np_, n):
        s += np.float64(np.float32(a[i] * b[i]))
    return np.float32(s)


@numba.njit(cache=True)
def _fa_chunk(qh, K, V, j0, j1, p, window, scale, acc, qq=None, kq=None, kd=None, qd=None,
              v_f16=True):  # pragma: no cover (compiled)
    """ggml_compute_forward_flash_attn_ext_f16_one_chunk for one query row and head over cells
    [j0, j1): online softmax with libm's expf. K f16 (qh: the f16-rounded query) or, when qq is
    given, q8_0 (qq / qd: the query as q8_0 blocks, kq / kd: the cache's, the integer dot); the
    output accumulated in f16 (v_f16: acc rounded after every scale and every fused
    multiply-add) or, for a q8_0 V, in float32. Returns (M, S); acc holds the unnormalized
    accumulator."""
    M = np.float32(-np.inf)
    S = np.float32(0.0)
    acc[:] = 0
    dv = acc.shape[0]
    for j in range(j0, j1):
        if j > p or (window > 0 and j <= p - window):
            continue  # masked cell (-inf): skipped
        if qq is None:
            s = np.float32(_dot_f16_avx2(qh, K[j]) * scale)
        else:
            s = np.float32(_dot_q8_0_avx2(kq[j], kd[j], qq, qd) * scale)
        s = np.float32(s + np.float32(0.0))
        if s > M:
            Mold = M
            M = s
            ms = np.float32(np.exp(np.float32(Mold - M)))
            for d in range(dv):
                acc[d] = _f16r(np.float32(acc[d] * ms)) if v_f16 else np.float32(acc[d] * ms)
            for d in range(dv):
                acc[d] = _f16r(np.float32(V[j, d] + acc[d])) if v_f16 else np.float32(V[j, d] + acc[d])
            S = np.float32(np.float32(S * ms) + np.float32(1.0))
        else:
            vs = np.float32(np.exp(np.float32(s - M)))
            for d in range(dv):
                acc[d] = _f16r(_fma(V[j, d], vs, acc[d])) if v_f16 else _fma(V[j, d], vs, acc[d])
            S = np.float32(S + vs)
    return M, S


@numba.njit(parallel=True, cache=True)
def _fa_rows_nb(q, pos, kc, vc, n_gqa, window, scale, n_kv, n_split, out):  # pragma: no cover
    """llama.cpp CPU's flash attention with an f16 KV cache, per query row (batches under 64
    queries). Decode over n_kv >= 512 cells splits the cells into n_split chunks (one per
    thread) and merges their partial results as ggml_flash_attn_ext_reduce_partials does."""
    n, n_head, hd = q.shape
    dv = vc.shape[2]
    for th in numba.prange(n * n_head):
        t = th // n_head
        h = th % n_head
        kvh = h // n_gqa
        qh = np.empty(hd, np.float32)
        for d in range(hd):
            qh[d] = _f16r(q[t, h, d])
        p = pos[t]
        K = kc[kvh]
        V = vc[kvh]
        acc = np.empty(dv, np.float32)
        if n_split <= 1:
            M, S = _fa_chunk(qh, K, V, 0, p + 1, p, window, scale, acc)
            inv = np.float32(0.0) if S == 0 else np.float32(np.float32(1.0) / S)
            for d in range(dv):
                out[t, h, d] = np.float32(acc[d] * inv)
        else:
            chunk = (n_kv + n_split - 1) // n_split
            Mf = np.float32(-np.inf)
            Sf = np.float32(0.0)
            fin = np.zeros(dv, np.float32)
            for c in range(n_split):
                j0 = c * chunk
                if j0 >= n_kv:
                    continue
                j1 = min(j0 + chunk, n_kv)
                Mc, Sc = _fa_chunk(qh, K, V, j0, min(j1, p + 1), p, window, scale, acc)
                if Sc == 0:
                    continue
                Mn = max(Mf, Mc)
                so = np.float32(np.exp(np.float32(Mf - Mn)))
                sn = np.float32(np.exp(np.float32(Mc - Mn)))
                for d in range(dv):  # as compiled: fma(final, scale_old, chunk * scale_new)
                    fin[d] = _fma(fin[d], so, np.float32(acc[d] * sn))
                Sf = _fma(Sf, so, np.float32(Sc * sn))
                Mf = Mn
            inv = np.float32(np.float32(1.0) / Sf) if Sf != 0 else np.float32(1.0)
            for d in range(dv):
                out[t, h, d] = np.float32(fin[d] * inv)


def attention_quant_kv(q, pos, kc, vc, k_codes, k_scales, n_gqa, window, scale, k_q8: bool, v_q8: bool):
    """llama.cpp CPU's flash attention when its KV cache is not f16 for both K and V (a q8_0
    K and/or V): ggml_compute_forward_flash_attn_ext_f16_one_chunk per query row for every
    batch size (no split-KV decode, no tiles: both want f16 or f32 K and V of one type).
    kc, vc: [n_head_kv, n_ctx, hd] the cache's values (f16 or q8_0 round trips);
    k_codes int8 [n_head_kv, n_ctx, hd] and k_scales float32 [n_head_kv, n_ctx, hd/32]: a q8_0
    K's blocks (read when k_q8). q [n, n_head, hd]; returns [n, n_head * hd_v]. See _fa_q_rows_nb."""
    n, n_head, hd = q.shape
    if not k_q8:
        k_codes = np.zeros((1, 1, 32), np.int8)
        k_scales = np.zeros((1, 1, 1), np.float32)
    out = np.empty((n, n_head, vc.shape[2]), np.float32)
    _fa_q_rows_nb(np.ascontiguousarray(q, np.float32), np.asarray(pos, np.int64),
                  np.ascontiguousarray(kc, np.float32), np.ascontiguousarray(vc, np.float32),
                  np.ascontiguousarray(k_codes, np.int8), np.ascontiguousarray(k_scales, np.float32),
                  n_gqa, window, np.float32(scale), bool(k_q8), bool(v_q8), out)
    return out.reshape(n, n_head * vc.shape[2])


@numba.njit(cache=True)
def _q8_0_row(x, q, d):  # pragma: no cover (compiled)
    """q8_0_quantize of one row (AVX2 quantize_row_q8_0) into int8 q and float32 d."""
    for b in range(x.shape[0] // 32):
        amax = np.float32(0.0)
        for j in range(32):
            amax = max(amax, abs(x[32 * b + j]))
        d[b] = _f16r(np.float32(amax / np.float32(127.0)))
        inv = np.float32(np.float32(127.0) / amax) if amax != 0 else np.float32(0.0)
        for j in range(32):
            y = np.float32(x[32 * b + j] * inv)
            q[32 * b + j] = np.int8(np.rint(y)) if np.isfinite(y) else np.int8(-128)


@numba.njit(cache=True, inline="always")
def _dot_q8_0_avx2(kq, kd, qq, qd):  # pragma: no cover (compiled)
    """ggml_vec_dot_q8_0_q8_0 (AVX2): per 32-block, 8 lanes of exact 4-element integer sums,
    lane = fma(f16 d_k * f16 d_q, float(sum), lane); then hsum_float_8."""
    acc = np.zeros(8, np.float32)
    for b in range(kq.shape[0] // 32):
        d = np.float32(kd[b] * qd[b])
        for j in range(8):
            xy = 0
            for k in range(4):
                xy += np.int32(kq[32 * b + 4 * j + k]) * np.int32(qq[32 * b + 4 * j + k])
            acc[j] = _fma(d, np.float32(xy), acc[j])
    r0 = np.float32(acc[4] + acc[0])
    r1 = np.float32(acc[5] + acc[1])
    r2 = np.float32(acc[6] + acc[2])
    r3 = np.float32(acc[7] + acc[3])
    return np.float32(np.float32(r0 + r2) + np.float32(r1 + r3))


@numba.njit(parallel=True, cache=True)
def _fa_q_rows_nb(q, pos, kc, vc, kq, kd, n_gqa, window, scale, k_q8, v_q8, out):  # pragma: no cover
    """One query row and head per iteration over cells 0..p, _fa_chunk's online softmax: K q8_0
    -> Q quantized to q8_0 (_q8_0_row) and the integer dot, f16 -> f16 Q and the f16 dot; V q8_0
    -> a float32 accumulator (ggml_vec_scale_f32, ggml_vec_mad_f32 on the dequantized row), f16
    -> the f16 one. Out: acc * (1/S)."""
    n, n_head, hd = q.shape
    dv = vc.shape[2]
    for th in numba.prange(n * n_head):
        t = th // n_head
        h = th % n_head
        kvh = h // n_gqa
        qh = np.empty(hd, np.float32)
        acc = np.empty(dv, np.float32)
        p = pos[t]
        if k_q8:
            qq = np.empty(hd, np.int8)
            qd = np.empty(hd // 32, np.float32)
            _q8_0_row(q[t, h], qq, qd)
            M, S = _fa_chunk(qh, kc[kvh], vc[kvh], 0, p + 1, p, window, scale, acc, qq, kq[kvh], kd[kvh], qd,
                             not v_q8)
        else:
            for d in range(hd):
                qh[d] = _f16r(q[t, h, d])
            M, S = _fa_chunk(qh, kc[kvh], vc[kvh], 0, p + 1, p, window, scale, acc, v_f16=not v_q8)
        inv = np.float32(0.0) if S == 0 else np.float32(np.float32(1.0) / S)
        for d in range(dv):
            out[t, h, d] = np.float32(acc[d] * inv)
