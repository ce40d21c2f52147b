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
  "llamacpp": llama.cpp CPU's float operations in its own order (memra/cpu/llamacpp.py): its
      logits are bit-identical to xllamacpp's on the two real models. `memra run --device cpu`
      uses it.
  "q8": the GPU engine's q8 path (kernels/q8.cuh): quantized-weight matmuls take activations
      rounded per 32 with d = amax/127, q = rint(x/d); f16 KV cache; float weights unrounded.

KV cache types (`ReferenceModel(g, cache_type_k=..., cache_type_v=...)`, llama.cpp's
--cache-type-k / --cache-type-v), each of K and V on its own:
  "f16" (default): K/V rows rounded to f16 when written (under "llamacpp" and "q8"; "f32"
      keeps them whole, as before).
  "q8_0": every K row (after RoPE) and V row is stored as q8_0 blocks when written, whatever
      the numerics — llama.cpp CPU's quantize_row_q8_0 (AVX2 build, the one its KV-cache write
      runs; memra.cpu.llamacpp.q8_0_quantize), per 32 consecutive values of one head row
      (head_dim must be a multiple of 32), all in float32:
          amax = max |x|
          d    = f16(amax / 127)          quotient rounded to float32, then to f16 half to even
          id   = 127 / amax               float32 division from amax (not 1/d); 0 when amax = 0
          q    = round-half-even(x * id)  the product rounded to float32 first; |q| <= 127
          stored value = float32(d) * q   exact (an f16 times an 8-bit integer)
      (ggml's portable quantize_row_q8_0_ref differs: id = 1/d of the float32 d, roundf half
      away from zero; the AVX2 kernel above is what xllamacpp, the CPU peer, runs.)
      The cache keeps the codes and scales too (KVCache.kq/kd, vq/vd). Under "llamacpp" the
      attention is then llama.cpp's per-row flash attention over a quantized cache for every
      batch (memra.cpu.llamacpp.attention_quant_kv: Q quantized to q8_0 and the integer dot for
      a q8_0 K, a float32 accumulator for a q8_0 V); under "f32" / "q8" the same attention
      arithmetic as the f16 cache's on the stored values.
      llama.cpp's own default differs in one respect: since its PR 21038 it rotates Q, K and V
      by a Hadamard matrix (and the attention output back) whenever a cache type is quantized
      and head_dim is a multiple of 64. memra's q8_0 cache does not rotate: its logits equal
      xllamacpp's run with LLAMA_ATTN_ROT_DISABLE=1 (tests/test_kvq8.py), the plain q8_0 round
      trip that experiments/kvq8/README.md specifies for the GPU kernels.
"""

from __future__ import annotations

import logging
import os
from typing import Sequence

import numba
import numpy as np

from memra.model.config import ModelConfig, read_config
from memra.errors import ContextOverflowError, GGUFError, MemraError
from memra.model.gguf import GGUFFile
from memra.cpu.llamacpp import (
                                FA_TILE_Q, Q8_0_ACT_TYPES, Q8_1_ACT_TYPES, attention_f16_acc, split_blocks,
                                q4_k_dot, q6_k_dot, q8_dot_matvec, geglu_ggml,
                                parse_q4_k, parse_q6_k, q8_k_blocks, q8_k_llamacpp, q8_llamacpp,
                                rms_norm_ggml, rope_ggml, round_f16, swiglu_ggml,
                                attention_quant_kv, q8_0_dequantize, q8_0_quantize)
from memra.model.kvtypes import check_cache_type
from memra.model.quants import SUPPORTED_TYPES, Codes, decompose, dequantize_rows, dequantize_tensor
from memra.model.quants import F16, F32, BF16, IQ4_NL, Q4_K, Q6_K

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


def silu(x: np.ndarray) -> np.ndarray:
    return x / (np.float32(1.0) + np.exp(-x))


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    """GELU, tanh approximation (ggml_gelu's formula)."""
    return np.float32(0.5) * x * (np.float32(1.0) + np.tanh(_SQRT_2_OVER_PI * x * (np.float32(1.0) + _GELU_COEF_A * x * x)))


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
    ReferenceModel, memra.gpu.engine.GPUEngine): the prompt's last logits, n tokens, and the
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


def round_bf16(x: np.ndarray) -> np.ndarray:
    """float32 -> bf16 with round-to-nearest-even (ggml's GGML_FP32_TO_BF16) -> float32."""
    u = np.ascontiguousarray(x, np.float32).view(np.uint32).astype(np.uint64)
    u = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16
    return u.astype(np.uint32).view(np.float32)


def q8_gpu(x: np.ndarray, block: int = 32) -> np.ndarray:
    """The GPU engine's q8 rule (kernels/q8.cuh): per 32, d = amax/127 (f32), q = rint(x/d)
    (IEEE division, half to even; 0 when amax = 0); x_hat = q * d. `block`: another block
    size for studies (experiments/act256)."""
    xb = split_blocks(x, block)
    amax = np.max(np.abs(xb), axis=-1, keepdims=True)
    d = amax / np.float32(127)
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.where(amax == 0, np.float32(0), np.rint(xb / d))
    return (q * d).reshape(x.shape).astype(np.float32)


def kv_cache_bytes(cfg: ModelConfig, n_ctx: int, cache_type_k: str = "f16", cache_type_v: str = "f16") -> int:
    """Bytes of a KVCache of n_ctx positions (float32 values, plus a q8_0 cache's codes and
    scales)."""
    per = 0
    for dim, t in ((cfg.head_dim, cache_type_k), (cfg.head_dim_v, cache_type_v)):
        per += 4 * dim + (dim + 4 * (dim // 32) if t == "q8_0" else 0)
    return cfg.n_layer * cfg.n_head_kv * int(n_ctx) * per


def available_memory() -> int | None:
    """The memory the kernel says a new allocation can take without swapping (MemAvailable);
    where /proc/meminfo does not say, the free (else the physical) pages sysconf reports; None
    where neither is known."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    for pages in ("SC_AVPHYS_PAGES", "SC_PHYS_PAGES"):
        try:
            n = os.sysconf(pages) * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError, AttributeError):
            continue
        if n > 0:
            return n
    return None


class KVCache:
    """Per-layer K and V, [n_head_kv, n_ctx, head_dim] float32; `pos` tokens are stored. One
    that cannot fit in the memory available is refused before anything is allocated. A q8_0
    K (V) also keeps its blocks: kq (vq) int8 [n_head_kv, n_ctx, head_dim] codes and kd (vd)
    float32 [n_head_kv, n_ctx, head_dim / 32] f16 scales; k (v) holds their values d * q.

    Setting `pos` lower rewinds (later positions are overwritten by the next forward)."""

    def __init__(self, cfg: ModelConfig, n_ctx: int, cache_type_k: str = "f16", cache_type_v: str = "f16"):
        if n_ctx <= 0:
            raise MemraError(f"KV cache size must be positive, got {n_ctx}")
        self.cache_type_k = check_cache_type(cache_type_k, "cache_type_k")
        self.cache_type_v = check_cache_type(cache_type_v, "cache_type_v")
        need = kv_cache_bytes(cfg, n_ctx, cache_type_k, cache_type_v)
        avail = available_memory()
        if avail is not None and need > avail:
            raise ContextOverflowError(
                f"a context of {n_ctx} tokens needs {need / 2**30:.2f} GiB of KV cache on the CPU "
                f"({cfg.n_layer} layers, float32) and this machine has {avail / 2**30:.2f} GiB available: "
                f"ask for a smaller context")
        self.n_ctx = int(n_ctx)
        self.pos = 0
        self.k = [np.zeros((cfg.n_head_kv, n_ctx, cfg.head_dim), np.float32) for _ in range(cfg.n_layer)]
        self.v = [np.zeros((cfg.n_head_kv, n_ctx, cfg.head_dim_v), np.float32) for _ in range(cfg.n_layer)]
        self.kq = self.kd = self.vq = self.vd = None
        if cache_type_k == "q8_0":
            self.kq, self.kd = self._blocks(cfg, n_ctx, cfg.head_dim)
        if cache_type_v == "q8_0":
            self.vq, self.vd = self._blocks(cfg, n_ctx, cfg.head_dim_v)

    @staticmethod
    def _blocks(cfg: ModelConfig, n_ctx: int, dim: int):
        codes = [np.zeros((cfg.n_head_kv, n_ctx, dim), np.int8) for _ in range(cfg.n_layer)]
        scales = [np.zeros((cfg.n_head_kv, n_ctx, dim // 32), np.float32) for _ in range(cfg.n_layer)]
        return codes, scales

    def write(self, il: int, p0: int, k: np.ndarray, v: np.ndarray) -> None:
        """Store rows k [n, n_head_kv, head_dim] and v at positions [p0, p0 + n) of layer il,
        a q8_0 side as its blocks (memra.cpu.llamacpp.q8_0_quantize) and their values."""
        n = k.shape[0]
        for rows, vals, codes, scales in ((k, self.k, self.kq, self.kd), (v, self.v, self.vq, self.vd)):
            rows = rows.transpose(1, 0, 2)
            if codes is not None:
                q, d = q8_0_quantize(rows)
                codes[il][:, p0:p0 + n] = q
                scales[il][:, p0:p0 + n] = d
                rows = q8_0_dequantize(q, d)
            vals[il][:, p0:p0 + n] = rows


class ReferenceModel:
    """A GGUF model evaluated in float32 on the CPU."""

    def __init__(self, g: GGUFFile, cfg: ModelConfig | None = None, numerics: str = "f32",
                 cache_type_k: str = "f16", cache_type_v: str = "f16"):
        if numerics not in NUMERICS:
            raise MemraError(f"numerics must be one of {', '.join(NUMERICS)}, got {numerics!r}")
        # the KV cache's types (module docstring): "f16" or "q8_0", K and V each on its own
        self.cache_type_k = check_cache_type(cache_type_k, "cache_type_k")
        self.cache_type_v = check_cache_type(cache_type_v, "cache_type_v")
        # "f32": exact float32 (the math oracle); "llamacpp": llama.cpp CPU's roundings (8-bit
        # activations per weight type, f16 KV cache, f16 Q, f16 GELU table); "q8": the GPU
        # engine's q8 path (8-bit activations per 32 for quantized weights, f16 KV cache)
        self.numerics = numerics
        # llama.cpp's thread count: its split-KV decode attention makes one chunk per thread
        self.threads = 2
        # called as on_layer(layers done, n_layer, tokens in this forward) after each layer
        # (the CLI's prefill progress bar); None: nothing is called
        self.on_layer = None
        self.g = g
        self.cfg = cfg if cfg is not None else read_config(g)
        self._w: dict[str, np.ndarray] = {}
        self._codes: dict[str, Codes] = {}
        self._kparts: dict[str, tuple] = {}  # raw Q4_K / Q6_K parts for the llamacpp numerics
        self._check_cache_types()
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

    def _check_cache_types(self) -> None:
        """A q8_0 cache quantizes each head row in blocks of 32 values: head_dim must divide."""
        for name, t, dim in (("K", self.cache_type_k, self.cfg.head_dim), ("V", self.cache_type_v, self.cfg.head_dim_v)):
            if t == "q8_0" and dim % 32:
                raise MemraError(f"a q8_0 {name} cache needs a head size that is a multiple of 32; "
                                 f"this model's is {dim}: use f16")

    @property
    def quant_kv(self) -> bool:
        """Whether K or V is cached as q8_0."""
        return "q8_0" in (self.cache_type_k, self.cache_type_v)

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
        if t in Q8_0_ACT_TYPES:
            return q8_llamacpp(x)[0], None
        if t in Q8_1_ACT_TYPES:
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
                    q4_k_dot(*parts, qa, da, bs, n - n % 4 if n > 3 else 0, out)
                else:  # the tiled K-quant matmul takes batches of 8 rows or more
                    q6_k_dot(*parts, qa, da, bs, n >= 8, out)
            return out
        if t not in Q8_0_ACT_TYPES and t not in Q8_1_ACT_TYPES or t == IQ4_NL:
            return None
        c = self.codes(name)
        xh, d16, q, s16 = q8_llamacpp(x, with_sum=t in Q8_1_ACT_TYPES)
        n = x.shape[0]
        out = np.empty((n, c.q.shape[0]), np.float32)
        qa = np.ascontiguousarray(q.reshape(n, -1), dtype=np.int8)
        sa = s16 if s16 is not None else np.zeros_like(d16)
        with _threads_for(out.size * x.shape[1]):
            q8_dot_matvec(c.q, c.scale, _NO_MIN if c.minv is None else c.minv, qa,
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
        return KVCache(self.cfg, n_ctx, self.cache_type_k, self.cache_type_v)

    def forward(self, tokens: Sequence[int], cache: KVCache, all_logits: bool = False) -> np.ndarray:
        """Append `tokens` at cache.pos; float32 logits [len(tokens), n_vocab] if all_logits,
        else [n_vocab] for the last token. Logits that are not all finite (NaN or infinite
        weights in a corrupt file) are a GGUFError naming the first such tensor; numpy's
        floating-point warnings on the way there are not printed."""
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            logits = self._forward(tokens, cache, all_logits)
        if not np.isfinite(logits).all():
            raise self._nonfinite_error()
        return logits

    def _nonfinite_error(self) -> MemraError:
        for name in self._expected_shapes():  # only on failure: decodes each weight once more
            try:
                with np.errstate(over="ignore", invalid="ignore"):
                    w = dequantize_tensor(self.g.tensor(name))
            except MemraError:
                continue
            if not np.isfinite(w).all():
                return GGUFError(self.g.path, f"tensor {name!r} holds NaN or infinite values "
                                              f"(the logits are not numbers): a corrupt file?")
        return MemraError(f"{self.g.path}: the forward pass gave NaN or infinite logits "
                          f"(every weight is finite: the activations overflowed)")

    def _forward(self, tokens: Sequence[int], cache: KVCache, all_logits: bool) -> np.ndarray:
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
            if self.on_layer is not None:
                self.on_layer(il + 1, c.n_layer, n)
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
            k = round_f16(k) if self.cache_type_k == "f16" else k
            v = round_f16(v) if self.cache_type_v == "f16" else v
        cache.write(il, int(pos[0]), k, v)  # a q8_0 side is quantized from the float32 rows
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
            if self.quant_kv:  # per-row at every batch size, no split-KV decode
                with _threads_for(n * c.n_head * c.head_dim_v * (int(pos[-1]) + 1)):
                    return attention_quant_kv(q, pos, cache.k[il], cache.v[il], cache.kq[il] if cache.kq else None,
                                              cache.kd[il] if cache.kd else None, c.n_gqa, window, scale,
                                              self.cache_type_k == "q8_0", self.cache_type_v == "q8_0")
            if n < FA_TILE_Q:  # the per-row path converts Q to the f16 K cache's dot type
                hi = int(pos[-1]) + 1
                n_kv = max(256, -(-hi // 256) * 256)  # llama.cpp's cells in view, padded to 256
                split = self.threads if n == 1 and n_kv >= 512 else 1
                with _threads_for(n * c.n_head * c.head_dim_v * hi):
                    return attention_f16_acc(q, pos, cache.k[il], cache.v[il], c.n_gqa, window, scale,
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
    from memra.model.aliases import resolve
    from memra.model.gguf import open_gguf

    return ReferenceModel(open_gguf(resolve(path_or_alias)))
