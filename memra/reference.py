"""The CPU reference forward pass: float32 numpy, the oracle for every GPU result.

One decoder for llama / qwen2 / qwen3 / gemma3, steered by `ModelConfig` switches, with
llama.cpp's math (tensor names as in llama.cpp's GGUF files):

    x = embed(tokens) * embd_scale
    per layer:  h = rmsnorm(x) * attn_norm
                q, k, v = h Wq (+bq), h Wk (+bk), h Wv (+bv)
                q, k = rmsnorm_per_head(q) * q_norm, ... (qk_norm)
                q, k = rope(q, k)                       (normal = adjacent pairs, neox = halves)
                a = softmax(scale * q k^T + causal/sliding mask) v       (GQA: head h -> kv h // n_gqa)
                a = a Wo;  a = rmsnorm(a) * post_attention_norm        (post_norms)
                x = x + a
                h = rmsnorm(x) * ffn_norm
                f = (act(h Wgate) * h Wup) Wdown;  f = rmsnorm(f) * post_ffw_norm  (post_norms)
                x = x + f
    logits = (rmsnorm(x) * output_norm) Wout     (Wout = token_embd when tied); softcap

Numerics (`ReferenceModel(g, numerics=...)`):
  "f32" (default): everything float32, the math oracle. Each weight is decoded once, on first
      use: prefill multiplies the float32 matrix (BLAS); decode (one or two rows) multiplies the
      same weights held as int8 codes with per-group scales (`quants.decompose`, bit-identical
      values). The two differ only in summation order (decode = prefill to 1e-4).
  "llamacpp": llama.cpp CPU's float operations in its own order, as the AVX2 build in PyPI's
      xllamacpp (a fixed x86-64 + AVX2/FMA/F16C build, whatever the host CPU) computes them:
      activations rounded per the weight type's vec_dot_type (q8_0 / q8_1 / q8_K) and the
      integer dot products' lane order and float accumulation of each kernel it runs (vec_dot,
      llamafile sgemm, the repacked Q4_K gemv/gemm, the tiled Q6_K matmul for 8+ rows), f16 KV
      cache, per-row flash attention (f16 Q, AVX2 f16 dot order, libm expf, f16 accumulator,
      split-KV merge for decode over 512+ cells), ggml's SIMD expf in SwiGLU, its f16 GELU table,
      rms_norm, and rope (libm sinf/cosf, its FMA contraction); the last layer's FFN on the output
      rows only. Fed llama.cpp's batches (tests/test_parity_models.py), its logits come out
      bit-identical to the wheel's on SmolLM2 Q4_1 and Gemma-3 Q4_K_M (experiments/llamacpp_dump).
      Not emulated bit for bit: the tiled flash attention of 64+ query batches (a float32
      softmax instead), the cell order of a sliding-window cache once cells are reused, and
      the kernels of other K-quants and IQ types (their q8_K rounding only).
      `memra run --device cpu` uses it.
  "q8": the GPU engine's q8 path (kernels/q8.cuh): quantized-weight matmuls take activations
      rounded per 32 with d = amax/127, q = rint(x/d); f16 KV cache; float weights unrounded.
"""

from __future__ import annotations

import logging
from typing import Sequence

import numba
import numpy as np

from .config import ModelConfig, read_config
from .errors import ContextOverflowError, GGUFError, MemraError
from .gguf_file import GGUFFile
from .quants import SUPPORTED_TYPES, Codes, decompose, dequantize_rows, dequantize_tensor
from .quants import F16, F32, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL, Q4_K, Q6_K

NUMERICS = ("f32", "llamacpp", "q8")

log = logging.getLogger("memra.reference")

# queries per attention block during prefill: bounds the score matrix at
# n_head * _Q_CHUNK * n_keys floats
_Q_CHUNK = 256

# at most this many rows of activations go through the quantized-weight matvec (decode);
# more go through BLAS on the float32 weights (prefill)
_DECODE_ROWS = 2

_SQRT_2_OVER_PI = np.float32(0.7978845608028654)
_GELU_COEF_A = np.float32(0.044715)


def rms_norm(x: np.ndarray, w: np.ndarray | None, eps: float) -> np.ndarray:
    """x / sqrt(mean(x^2) + eps) * w over the last axis (ggml_rms_norm then ggml_mul)."""
    ms = np.mean(np.square(x, dtype=np.float32), axis=-1, keepdims=True, dtype=np.float32)
    y = x * (np.float32(1.0) / np.sqrt(ms + np.float32(eps)))
    return y * w if w is not None else y


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


def silu(x: np.ndarray) -> np.ndarray:
    return x / (np.float32(1.0) + np.exp(-x))


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    """GELU, tanh approximation (ggml_gelu's formula)."""
    return np.float32(0.5) * x * (np.float32(1.0) + np.tanh(_SQRT_2_OVER_PI * x * (np.float32(1.0) + _GELU_COEF_A * x * x)))


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


def rope_inv_freq(rope_dim: int, base: float, freq_scale: float = 1.0,
                  freq_factors: np.ndarray | None = None) -> np.ndarray:
    """theta_i / pos = base^(-2i/rope_dim) * freq_scale / freq_factor_i, i < rope_dim/2 (float64)."""
    i = np.arange(rope_dim // 2, dtype=np.float64)
    f = base ** (-2.0 * i / rope_dim) * freq_scale
    if freq_factors is not None:
        f = f / freq_factors.astype(np.float64)
    return f


def rope(x: np.ndarray, pos: np.ndarray, inv_freq: np.ndarray, neox: bool) -> np.ndarray:
    """Rotate the first 2*len(inv_freq) dims of x [T, heads, head_dim] at positions pos [T].

    Normal (llama): pairs (2i, 2i+1) rotate by theta_i. NeoX: pairs (i, i + rope_dim/2)."""
    theta = pos.astype(np.float64)[:, None] * inv_freq[None, :]
    return _rotate(x, np.cos(theta).astype(np.float32), np.sin(theta).astype(np.float32), neox)


def _rotate(x: np.ndarray, cos: np.ndarray, sin: np.ndarray, neox: bool) -> np.ndarray:
    """Rotate x [T, heads, head_dim] by angles with cos/sin [T, n] (n pairs, the rest kept)."""
    n = cos.shape[-1]
    cos, sin = cos[:, None, :], sin[:, None, :]
    out = x.copy()
    if neox:
        x0, x1 = x[..., :n], x[..., n:2 * n]
        out[..., :n] = x0 * cos - x1 * sin
        out[..., n:2 * n] = x0 * sin + x1 * cos
    else:
        x0, x1 = x[..., 0:2 * n:2], x[..., 1:2 * n:2]
        out[..., 0:2 * n:2] = x0 * cos - x1 * sin
        out[..., 1:2 * n:2] = x0 * sin + x1 * cos
    return out


def softmax(x: np.ndarray) -> np.ndarray:
    m = np.max(x, axis=-1, keepdims=True)
    e = np.exp(x - m)
    return e / np.sum(e, axis=-1, keepdims=True)


def top2_margin(logits: np.ndarray) -> float:
    """The gap between the two largest logits (a near-tie when it is small)."""
    top = np.partition(np.asarray(logits), -2)[-2:]
    return float(top[1] - top[0])


def greedy_with_margins(model, prompt: Sequence[int], n: int) -> tuple[np.ndarray, list[int], list[float]]:
    """Greedy decoding on any engine with the new_cache/forward protocol (this module's
    ReferenceModel, memra.engine.GPUEngine): the prompt's last logits, n tokens, and the
    top-2 margin of the logits each token was chosen from."""
    cache = model.new_cache(len(prompt) + n)
    logits = first = model.forward(list(prompt), cache)
    toks, margins = [], []
    for i in range(n):
        margins.append(top2_margin(logits))
        toks.append(int(np.argmax(logits)))
        if i + 1 < n:
            logits = model.forward([toks[-1]], cache)
    return first, toks, margins


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """Log-probabilities over the last axis (float64 for the comparisons tests make)."""
    z = np.asarray(logits, dtype=np.float64)
    z = z - z.max(axis=-1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


@numba.njit(parallel=True, cache=True, fastmath={"reassoc"})
def _codes_matvec(q, scale, minv, group, x, out):  # pragma: no cover (compiled)
    """out[t, r] = sum_c w[r, c] * x[t, c] with w = scale * q (+ minv) decoded in registers.

    The same float32 weights as the dequantized matrix (no fused multiply-add: 'contract' is
    not allowed), read as int8 codes: decode moves a quarter of the bytes of a float32 matvec.
    Only the summation order differs from BLAS ('reassoc' lets the inner loop vectorize)."""
    rows, cols = q.shape
    ng = cols // group
    has_min = minv.shape[0] > 0
    for r in numba.prange(rows):
        for t in range(x.shape[0]):
            acc = np.float32(0.0)
            for g in range(ng):
                s = scale[r, g]
                m = minv[r, g] if has_min else np.float32(0.0)
                base = g * group
                part = np.float32(0.0)
                for j in range(group):
                    part += (s * np.float32(q[r, base + j]) + m) * x[t, base + j]
                acc += part
            out[t, r] = acc


@numba.njit(parallel=True, cache=True)
def _q8_dot_matvec(q, scale, minv, qa, da, sa, out):  # pragma: no cover (compiled)
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
    x = np.ascontiguousarray(_blocks(x, 256).reshape(x.shape), np.float32)
    n, k = x.shape
    q = np.empty((n, k), np.int8)
    d = np.empty((n, k // 256), np.float32)
    bsum = np.empty((n, k // 16), np.int32)
    _q8_k_nb(x, q, d, bsum)
    return q, d, bsum


@numba.njit(parallel=True, cache=True)
def _q4_k_dot(q4, sc, mn, dw, dmw, qa, da, bsum, gemm_rows, out):  # pragma: no cover (compiled)
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
def _q6_k_dot(q6, sc, dw, qa, da, bsum, tiled, out):  # pragma: no cover (compiled)
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
    from .quants import _f16, _k4_scales
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
    from .quants import _f16
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


class _threads_for:
    """Run a numba kernel on one thread when its work is small: waking a second thread costs
    more than a decode-sized matvec saves, and on a loaded machine far more."""

    def __init__(self, work: int):
        self.small = work < (1 << 21)

    def __enter__(self):
        if self.small:
            self.n = numba.get_num_threads()
            numba.set_num_threads(1)

    def __exit__(self, *exc):
        if self.small:
            numba.set_num_threads(self.n)


_NO_MIN = np.zeros((0, 0), np.float32)


def _small_bmm(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Batched a @ b without BLAS (numpy's einsum loops), for decode-sized attention."""
    return np.einsum("hik,hkj->hij", a, b)


def round_f16(x: np.ndarray) -> np.ndarray:
    """float32 -> nearest f16 (half to even, as F16C) -> float32."""
    return np.asarray(x, np.float32).astype(np.float16).astype(np.float32)


def round_bf16(x: np.ndarray) -> np.ndarray:
    """float32 -> bf16 with round-to-nearest-even (ggml's GGML_FP32_TO_BF16) -> float32."""
    u = np.ascontiguousarray(x, np.float32).view(np.uint32).astype(np.uint64)
    u = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16
    return u.astype(np.uint32).view(np.float32)


def _blocks(x: np.ndarray, n: int) -> np.ndarray:
    x = np.asarray(x, np.float32)
    if x.shape[-1] % n:
        raise MemraError(f"activation rows of {x.shape[-1]} values are not whole blocks of {n}")
    return x.reshape(*x.shape[:-1], x.shape[-1] // n, n)


def q8_llamacpp(x: np.ndarray, with_sum: bool = False):
    """llama.cpp CPU's quantize_row_q8_0 / q8_1 (the AVX2 build xllamacpp ships): per 32,
    id = 127/amax, q = round-half-even(x * id), d stored as f16. Returns (x_hat [.., n],
    the f16 d [.., n/32], and for q8_1 the f16 s = d * sum(q) it stores [.., n/32])."""
    xb = _blocks(x, 32)
    amax = np.max(np.abs(xb), axis=-1)
    d = amax / np.float32(127)
    with np.errstate(divide="ignore"):
        inv = np.where(amax != 0, np.float32(127) / amax, np.float32(0)).astype(np.float32)
    q = np.rint(xb * inv[..., None])
    d16 = round_f16(d)
    xh = (q * d16[..., None]).reshape(x.shape)
    s16 = round_f16(d * q.sum(axis=-1)) if with_sum else None
    return xh, d16, q, s16


def q8_k_llamacpp(x: np.ndarray) -> np.ndarray:
    """ggml quantize_row_q8_K(_ref): per 256, max = the signed value of largest magnitude
    (first one), iscale = -127/max, q = min(127, nearest_int(iscale * x)), d = 1/iscale (f32)."""
    xb = _blocks(x, 256)
    idx = np.argmax(np.abs(xb), axis=-1)
    mx = np.take_along_axis(xb, idx[..., None], axis=-1)
    with np.errstate(divide="ignore"):
        iscale = np.where(mx != 0, np.float32(-127) / mx, np.float32(0)).astype(np.float32)
        d = np.where(mx != 0, np.float32(1) / iscale, np.float32(0)).astype(np.float32)
    q = np.minimum(np.rint(iscale * xb), np.float32(127))
    return (q * d).reshape(x.shape)


def q8_gpu(x: np.ndarray) -> np.ndarray:
    """The GPU engine's q8 rule (kernels/q8.cuh): per 32, d = amax/127 (f32), q = rint(x/d)
    (IEEE division, half to even; 0 when amax = 0); x_hat = q * d."""
    xb = _blocks(x, 32)
    amax = np.max(np.abs(xb), axis=-1, keepdims=True)
    d = amax / np.float32(127)
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.where(amax == 0, np.float32(0), np.rint(xb / d))
    return (q * d).reshape(x.shape).astype(np.float32)


# llama.cpp CPU: the activation format each weight type's dot product wants (vec_dot_type)
_Q8_0_TYPES = frozenset({Q4_0, Q5_0, Q8_0, IQ4_NL})
_Q8_1_TYPES = frozenset({Q4_1, Q5_1})


# llama.cpp CPU flash attention: batches of fewer queries than this run the per-row path
# (f16 Q, f16 output accumulator); larger ones run tiles in float32
FA_TILE_Q = 64


def _attention_f16_acc(q, pos, kc, vc, n_gqa, window, scale, n_kv: int = 256, n_split: int = 1):
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
def _fa_chunk(qh, K, V, j0, j1, p, window, scale, acc):  # pragma: no cover (compiled)
    """ggml_compute_forward_flash_attn_ext_f16_one_chunk for one query row and head over cells
    [j0, j1) of an f16 cache: online softmax with libm's expf, the output accumulated in f16
    (acc rounded after every scale and every fused multiply-add). Returns (M, S); acc holds
    the unnormalized f16 accumulator."""
    M = np.float32(-np.inf)
    S = np.float32(0.0)
    acc[:] = 0
    dv = acc.shape[0]
    for j in range(j0, j1):
        if j > p or (window > 0 and j <= p - window):
            continue  # masked cell (-inf): skipped
        s = np.float32(_dot_f16_avx2(qh, K[j]) * scale)
        s = np.float32(s + np.float32(0.0))
        if s > M:
            Mold = M
            M = s
            ms = np.float32(np.exp(np.float32(Mold - M)))
            for d in range(dv):
                acc[d] = _f16r(np.float32(acc[d] * ms))
            for d in range(dv):
                acc[d] = _f16r(np.float32(V[j, d] + acc[d]))
            S = np.float32(np.float32(S * ms) + np.float32(1.0))
        else:
            vs = np.float32(np.exp(np.float32(s - M)))
            for d in range(dv):
                acc[d] = _f16r(_fma(V[j, d], vs, acc[d]))
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


class KVCache:
    """Per-layer K and V, [n_head_kv, n_ctx, head_dim] float32; `pos` tokens are stored.

    Setting `pos` lower rewinds (later positions are overwritten by the next forward)."""

    def __init__(self, cfg: ModelConfig, n_ctx: int):
        if n_ctx <= 0:
            raise MemraError(f"KV cache size must be positive, got {n_ctx}")
        self.n_ctx = int(n_ctx)
        self.pos = 0
        self.k = [np.zeros((cfg.n_head_kv, n_ctx, cfg.head_dim), np.float32) for _ in range(cfg.n_layer)]
        self.v = [np.zeros((cfg.n_head_kv, n_ctx, cfg.head_dim_v), np.float32) for _ in range(cfg.n_layer)]


class ReferenceModel:
    """A GGUF model evaluated in float32 on the CPU."""

    def __init__(self, g: GGUFFile, cfg: ModelConfig | None = None, numerics: str = "f32"):
        if numerics not in NUMERICS:
            raise MemraError(f"numerics must be one of {', '.join(NUMERICS)}, got {numerics!r}")
        # "f32": exact float32 (the math oracle); "llamacpp": llama.cpp CPU's roundings (8-bit
        # activations per weight type, f16 KV cache, f16 Q, f16 GELU table); "q8": the GPU
        # engine's q8 path (8-bit activations per 32 for quantized weights, f16 KV cache)
        self.numerics = numerics
        # llama.cpp's thread count: its split-KV decode attention makes one chunk per thread
        self.threads = 2
        self.g = g
        self.cfg = cfg if cfg is not None else read_config(g)
        self._w: dict[str, np.ndarray] = {}
        self._codes: dict[str, Codes] = {}
        self._kparts: dict[str, tuple] = {}  # raw Q4_K / Q6_K parts for the llamacpp numerics
        self._check_tensors()
        c = self.cfg
        self._freq_factors = self.weight("rope_freqs.weight") if c.has_rope_freqs else None
        self._inv_freq = [rope_inv_freq(c.rope_dim, c.layer_rope_base(i), self._layer_freq_scale(i),
                                        self._freq_factors) for i in range(c.n_layer)]

    # -- weights -------------------------------------------------------------------------
    def _expected_shapes(self) -> dict[str, tuple[int, ...]]:
        c = self.cfg
        e = {"token_embd.weight": (c.n_vocab, c.n_embd), "output_norm.weight": (c.n_embd,)}
        if not c.tied_output:
            e["output.weight"] = (c.n_vocab, c.n_embd)
        if c.has_rope_freqs:
            e["rope_freqs.weight"] = (c.rope_dim // 2,)
        for i in range(c.n_layer):
            p = f"blk.{i}."
            e.update({
                p + "attn_norm.weight": (c.n_embd,),
                p + "attn_q.weight": (c.q_dim, c.n_embd),
                p + "attn_k.weight": (c.kv_dim, c.n_embd),
                p + "attn_v.weight": (c.v_dim, c.n_embd),
                p + "attn_output.weight": (c.n_embd, c.n_head * c.head_dim_v),
                p + "ffn_norm.weight": (c.n_embd,),
                p + "ffn_gate.weight": (c.n_ff, c.n_embd),
                p + "ffn_up.weight": (c.n_ff, c.n_embd),
                p + "ffn_down.weight": (c.n_embd, c.n_ff),
            })
            if c.qkv_bias:
                e.update({p + "attn_q.bias": (c.q_dim,), p + "attn_k.bias": (c.kv_dim,),
                          p + "attn_v.bias": (c.v_dim,)})
            if c.qk_norm:
                e.update({p + "attn_q_norm.weight": (c.head_dim,), p + "attn_k_norm.weight": (c.head_dim,)})
            if c.post_norms:
                e.update({p + "post_attention_norm.weight": (c.n_embd,), p + "post_ffw_norm.weight": (c.n_embd,)})
        return e

    def _check_tensors(self) -> None:
        """Every tensor the forward pass reads exists with the shape the config implies."""
        for name, shape in self._expected_shapes().items():
            t = self.g.tensor(name)  # GGUFError naming the missing tensor
            if tuple(t.shape) != shape:
                raise GGUFError(self.g.path, f"tensor {name!r} has shape {t.shape}, expected {shape}")

    def weight(self, name: str) -> np.ndarray:
        """A tensor as float32 (decoded on first use, then kept)."""
        w = self._w.get(name)
        if w is None:
            c = self.codes(name)
            w = self._w[name] = c.dequantize() if c is not None else dequantize_tensor(self.g.tensor(name))
        return w

    def codes(self, name: str) -> Codes | None:
        """A block-quantized matrix as int8 codes and group scales (None for float tensors)."""
        c = self._codes.get(name)
        if c is None:
            t = self.g.tensor(name)
            if len(t.shape) != 2 or t.ggml_type in (F32, F16, BF16) or t.ggml_type not in SUPPORTED_TYPES:
                return None
            c = self._codes[name] = decompose(t.data, t.ggml_type, t.shape)
        return c

    def load_all(self) -> None:
        """Dequantize every weight now (otherwise each is decoded on first use)."""
        for name in self._expected_shapes():
            self.weight(name)

    def _layer_freq_scale(self, layer: int) -> float:
        # llama.cpp: gemma3's sliding-window layers use their own rope (base 10k, scale 1)
        if self.cfg.is_swa(layer) and self.cfg.rope_base_swa is not None:
            return 1.0
        return self.cfg.rope_freq_scale

    def _rms(self, x, w, eps):
        if self.numerics == "llamacpp":
            return rms_norm_ggml(x, w, eps)
        return rms_norm(x, w, eps)

    def _rope(self, x, pos, il):
        c = self.cfg
        if self.numerics == "llamacpp":
            return rope_ggml(x, pos, c.layer_rope_base(il), self._layer_freq_scale(il), c.rope_dim,
                             self._freq_factors, c.rope_neox)
        return rope(x, pos, self._inv_freq[il], c.rope_neox)

    def _round_act(self, x: np.ndarray, name: str):
        """The activations the weight `name` is multiplied with under this model's numerics,
        and a per-32 correction for the q8_1 block sum (llama.cpp's Q4_1/Q5_1 dot products
        multiply the weight's min by the block's stored f16 s = d * sum(q), not by f16(d) * sum(q))."""
        if self.numerics == "f32":
            return x, None
        t = self.g.tensor(name).ggml_type
        if t == F32:
            return x, None
        if self.numerics == "q8":
            return (x, None) if t in (F16, BF16) else (q8_gpu(x), None)
        if t == F16:
            return round_f16(x), None
        if t == BF16:
            return round_bf16(x), None
        if t in _Q8_0_TYPES:
            return q8_llamacpp(x)[0], None
        if t in _Q8_1_TYPES:
            xh, d16, q, s16 = q8_llamacpp(x, with_sum=True)
            return xh, s16 - d16 * q.sum(axis=-1)
        return q8_k_llamacpp(x), None  # K-quants, IQ4_XS: q8_K

    def _mm_lc_int(self, x: np.ndarray, name: str):
        """llama.cpp's integer dot products for 32-block weights and Q4_K / Q6_K (None for
        other types)."""
        t = self.g.tensor(name).ggml_type
        if t in (Q4_K, Q6_K):
            parts = self._kparts.get(name)
            if parts is None:
                ti = self.g.tensor(name)
                parts = self._kparts[name] = parse_q4_k(ti) if t == Q4_K else parse_q6_k(ti)
            qa, da, bs = q8_k_blocks(x)
            out = np.empty((x.shape[0], parts[0].shape[0]), np.float32)
            n = x.shape[0]
            with _threads_for(out.size * x.shape[1]):
                if t == Q4_K:  # repacked: gemm on whole groups of 4 rows (if more than 3), gemv on the rest
                    _q4_k_dot(*parts, qa, da, bs, n - n % 4 if n > 3 else 0, out)
                else:  # the tiled K-quant matmul takes batches of 8 rows or more
                    _q6_k_dot(*parts, qa, da, bs, n >= 8, out)
            return out
        if t not in _Q8_0_TYPES and t not in _Q8_1_TYPES or t == IQ4_NL:
            return None
        c = self.codes(name)
        xh, d16, q, s16 = q8_llamacpp(x, with_sum=t in _Q8_1_TYPES)
        n = x.shape[0]
        out = np.empty((n, c.q.shape[0]), np.float32)
        qa = np.ascontiguousarray(q.reshape(n, -1), dtype=np.int8)
        sa = s16 if s16 is not None else np.zeros_like(d16)
        with _threads_for(out.size * x.shape[1]):
            _q8_dot_matvec(c.q, c.scale, _NO_MIN if c.minv is None else c.minv, qa,
                           np.ascontiguousarray(d16, np.float32), np.ascontiguousarray(sa, np.float32), out)
        return out

    def _mm(self, x: np.ndarray, name: str) -> np.ndarray:
        if self.numerics == "llamacpp":
            y = self._mm_lc_int(x, name)
            if y is not None:
                return y
        """x [n, in] times the weight [out, in] transposed (x rounded first as the numerics
        say): BLAS on the float32 weights, or for decode-sized n on a quantized weight, the
        int8-code matvec (a quarter of the bytes)."""
        x, corr = self._round_act(x, name)
        y = self._mm_raw(x, name)
        if corr is not None:
            c = self.codes(name)
            y = y + corr.astype(np.float32) @ c.minv.T
        return y

    def _mm_raw(self, x: np.ndarray, name: str) -> np.ndarray:
        if x.shape[0] <= _DECODE_ROWS:
            c = self.codes(name)
            if c is not None:
                out = np.empty((x.shape[0], c.q.shape[0]), np.float32)
                _codes_matvec(c.q, c.scale, _NO_MIN if c.minv is None else c.minv, c.group,
                              np.ascontiguousarray(x, dtype=np.float32), out)
                return out
        return x @ self.weight(name).T

    def _embed(self, tokens: np.ndarray) -> np.ndarray:
        full = self._w.get("token_embd.weight")
        x = full[tokens] if full is not None else dequantize_rows(self.g.tensor("token_embd.weight"), tokens)
        if self.cfg.embd_scale != 1.0:
            x = x * np.float32(self.cfg.embd_scale)
        return x

    # -- forward ---------------------------------------------------------------------------
    def new_cache(self, n_ctx: int) -> KVCache:
        return KVCache(self.cfg, n_ctx)

    def forward(self, tokens: Sequence[int], cache: KVCache, all_logits: bool = False) -> np.ndarray:
        """Append `tokens` at cache.pos; float32 logits [len(tokens), n_vocab] if all_logits,
        else [n_vocab] for the last token."""
        c = self.cfg
        toks = self._check_tokens(tokens)
        n = len(toks)
        if cache.pos + n > cache.n_ctx:
            raise ContextOverflowError(f"{cache.pos} cached + {n} new tokens exceed the context of "
                                       f"{cache.n_ctx} tokens")
        pos = np.arange(cache.pos, cache.pos + n)
        x = self._embed(toks)
        for il in range(c.n_layer):
            # llama.cpp computes the last layer's FFN only on the rows it outputs (ggml_get_rows
            # after the attention), which picks the batch size its matmul kernels see
            last_rows = il == c.n_layer - 1 and not all_logits and self.numerics == "llamacpp"
            x = self._layer(il, x, pos, cache, out_last=last_rows)
        cache.pos += n

        if not all_logits:
            x = x[-1:]
        h = self._rms(x, self.weight("output_norm.weight"), c.norm_eps)
        logits = self._mm(h, "token_embd.weight" if c.tied_output else "output.weight")
        if c.final_logit_softcap:
            cap = np.float32(c.final_logit_softcap)
            logits = np.tanh(logits / cap) * cap
        return logits if all_logits else logits[0]

    def _check_tokens(self, tokens: Sequence[int]) -> np.ndarray:
        try:
            toks = np.asarray(tokens)
        except (TypeError, ValueError):
            raise MemraError("tokens must be a sequence of integer ids") from None
        if toks.ndim != 1 or toks.size == 0:
            raise MemraError(f"tokens must be a non-empty 1-D sequence of ids, got shape {toks.shape}")
        if not np.issubdtype(toks.dtype, np.integer):
            raise MemraError(f"token ids must be integers, got {toks.dtype}")
        bad = (toks < 0) | (toks >= self.cfg.n_vocab)
        if bad.any():
            raise MemraError(f"token id {int(toks[bad][0])} at index {int(np.argmax(bad))} is outside "
                             f"the vocabulary [0, {self.cfg.n_vocab})")
        return toks.astype(np.int64)

    def _layer(self, il: int, x: np.ndarray, pos: np.ndarray, cache: KVCache, out_last: bool = False) -> np.ndarray:
        c = self.cfg
        w = self.weight
        p = f"blk.{il}."
        n = x.shape[0]

        h = self._rms(x, w(p + "attn_norm.weight"), c.norm_eps)
        q = self._mm(h, p + "attn_q.weight")
        k = self._mm(h, p + "attn_k.weight")
        v = self._mm(h, p + "attn_v.weight")
        if c.qkv_bias:
            q = q + w(p + "attn_q.bias")
            k = k + w(p + "attn_k.bias")
            v = v + w(p + "attn_v.bias")
        q = q.reshape(n, c.n_head, c.head_dim)
        k = k.reshape(n, c.n_head_kv, c.head_dim)
        v = v.reshape(n, c.n_head_kv, c.head_dim_v)
        if c.qk_norm:
            q = self._rms(q, w(p + "attn_q_norm.weight"), c.norm_eps)
            k = self._rms(k, w(p + "attn_k_norm.weight"), c.norm_eps)
        q = self._rope(q, pos, il)
        k = self._rope(k, pos, il)

        if self.numerics != "f32":  # an f16 KV cache, as llama.cpp's default and the GPU engine's
            k, v = round_f16(k), round_f16(v)
        p0 = int(pos[0])
        cache.k[il][:, p0:p0 + n] = k.transpose(1, 0, 2)
        cache.v[il][:, p0:p0 + n] = v.transpose(1, 0, 2)
        a = self._attention(il, q, pos, cache)

        a = self._mm(a, p + "attn_output.weight")
        if out_last:
            a, x = a[-1:], x[-1:]
        if c.post_norms:
            a = self._rms(a, w(p + "post_attention_norm.weight"), c.norm_eps)
        x = x + a

        h = self._rms(x, w(p + "ffn_norm.weight"), c.norm_eps)
        gate = self._mm(h, p + "ffn_gate.weight")
        up = self._mm(h, p + "ffn_up.weight")
        f = self._mm(self._glu(gate, up), p + "ffn_down.weight")
        if c.post_norms:
            f = self._rms(f, w(p + "post_ffw_norm.weight"), c.norm_eps)
        return x + f

    def _glu(self, gate: np.ndarray, up: np.ndarray) -> np.ndarray:
        """act(gate) * up (llama.cpp's swiglu / geglu ops)."""
        if self.cfg.act != "gelu_tanh":
            if self.numerics == "llamacpp":
                return swiglu_ggml(gate, up)
            act = silu(gate)
        elif self.numerics == "llamacpp":
            return geglu_ggml(gate, up)
        else:
            act = gelu_tanh(gate)
        return act * up

    def _attention(self, il: int, q: np.ndarray, pos: np.ndarray, cache: KVCache) -> np.ndarray:
        """Causal (and, on sliding-window layers, windowed) attention of q [n, n_head, hd] over
        the cache up to the last query; returns [n, n_head * head_dim_v]."""
        c = self.cfg
        n = q.shape[0]
        window = c.swa_window if c.is_swa(il) else 0
        scale = np.float32(c.scale)
        if self.numerics == "llamacpp":
            # gemma3's graph scales Q before the attention op (the others pass the scale in)
            if c.arch == "gemma3":
                q, scale = q * scale, np.float32(1.0)
            if n < FA_TILE_Q:  # the per-row path converts Q to the f16 K cache's dot type
                hi = int(pos[-1]) + 1
                n_kv = max(256, -(-hi // 256) * 256)  # llama.cpp's cells in view, padded to 256
                split = self.threads if n == 1 and n_kv >= 512 else 1
                with _threads_for(n * c.n_head * c.head_dim_v * hi):
                    return _attention_f16_acc(q, pos, cache.k[il], cache.v[il], c.n_gqa, window, scale,
                                              n_kv, split)
        out = np.empty((n, c.n_head, c.head_dim_v), np.float32)
        for s in range(0, n, _Q_CHUNK):
            qp = pos[s:s + _Q_CHUNK]
            t = qp.shape[0]
            k_end = int(qp[-1]) + 1
            # keys any query in the block can see: j <= p, and p - window < j on SWA layers
            k_start = max(0, int(qp[0]) - window + 1) if window else 0
            kj = np.arange(k_start, k_end)
            K = cache.k[il][:, k_start:k_end]  # [n_kv, S, hd]
            V = cache.v[il][:, k_start:k_end]
            # group query heads by their kv head: [n_kv, n_gqa * t, hd]
            qg = q[s:s + t].reshape(t, c.n_head_kv, c.n_gqa, c.head_dim).transpose(1, 2, 0, 3)
            qg = qg.reshape(c.n_head_kv, c.n_gqa * t, c.head_dim)
            # decode: einsum's own loops, not BLAS — waking OpenBLAS's threads every step starves
            # the numba matvec's threads on a small machine (5x slower decode on 2 cores)
            mm = _small_bmm if n <= _DECODE_ROWS else np.matmul
            scores = mm(qg, K.transpose(0, 2, 1)) * scale
            scores = scores.reshape(c.n_head_kv, c.n_gqa, t, -1)
            visible = kj[None, :] <= qp[:, None]
            if window:
                visible &= kj[None, :] > qp[:, None] - window
            scores = np.where(visible, scores, np.float32(-np.inf))
            probs = softmax(scores).reshape(c.n_head_kv, c.n_gqa * t, -1)
            o = mm(probs, V).reshape(c.n_head_kv, c.n_gqa, t, c.head_dim_v)
            out[s:s + t] = o.transpose(2, 0, 1, 3).reshape(t, c.n_head, c.head_dim_v)
        return out.reshape(n, c.n_head * c.head_dim_v)


def load(path_or_alias: str) -> ReferenceModel:
    """Open a model by path or alias and wrap it (weights decode lazily)."""
    from .aliases import resolve
    from .gguf_file import open_gguf

    return ReferenceModel(open_gguf(resolve(path_or_alias)))
