"""GGML block formats: dequantization to float32, and the int8 activation quantizers.

Each dequantizer is written from the block layout in ggml's `ggml-common.h` /
`ggml-quants.c` and evaluates the same float32 expression in the same order as ggml's
`dequantize_row_*` (e.g. Q4_K: `(d*sc) * q - (dmin*m)`), so results are bit-identical to
ggml's and to `gguf.quants.dequantize` (checked in tests/test_quants.py).

The activation quantizers (`quantize_q8_0`, `quantize_q8_1`) follow ggml's reference
`quantize_row_q8_{0,1}_ref`: per block of 32, d = amax/127, q = roundf(x * (1/d)) with
round-half-away-from-zero. GPU kernels that quantize activations mirror them.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from memra.errors import MemraError, UnsupportedModelError
from memra.model.gguf import TensorInfo, block_info, type_name

QK_K = 256

# ggml type ids (ggml.h); only the ones memra reads
F32, F16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1 = 0, 1, 2, 3, 6, 7, 8, 9
Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q8_K = 10, 11, 12, 13, 14, 15
IQ4_NL, BF16, IQ4_XS = 20, 30, 23

# the non-linear 4-bit codebook of IQ4_NL / IQ4_XS
KVALUES_IQ4NL = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113],
                         dtype=np.int8)

# blocks per chunk: bounds the temporaries of one vectorized pass (~a few MB each)
_CHUNK_BLOCKS = 1 << 15


def _f16(b: np.ndarray) -> np.ndarray:
    """Little-endian half floats stored in byte columns [..., 2k] -> float32 [..., k]."""
    return np.ascontiguousarray(b).view("<f2").astype(np.float32)


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """[n, 16*k] packed bytes -> [n, k, 32] with low nibbles of each 16-byte group first, then
    high nibbles (the ggml 32-element layout: element j in the low half of byte j, j+16 high)."""
    n = qs.shape[0]
    g = qs.reshape(n, -1, 16)
    return np.concatenate([g & 0x0F, g >> 4], axis=-1)


# --- 32-element block formats --------------------------------------------------------------
# Every block function returns (q, scale, minv): int8 codes [n, bs], float32 [n, n_groups] and
# float32 [n, n_groups] or None, such that the weight is scale * q (+ minv) per group of
# bs / n_groups elements -- the one multiply (and add) ggml's dequantize_row_* does per weight.

def _q4_0(b):  # d:f16, qs[16]
    return _nibbles(b[:, 2:18]).reshape(-1, 32).astype(np.int8) - np.int8(8), _f16(b[:, 0:2]), None


def _q4_1(b):  # d:f16, m:f16, qs[16]
    return _nibbles(b[:, 4:20]).reshape(-1, 32).astype(np.int8), _f16(b[:, 0:2]), _f16(b[:, 2:4])


def _high_bits32(qh: np.ndarray) -> np.ndarray:
    """qh[4] bytes as a little-endian u32; bit j is the 5th bit of element j -> [n, 32] as 0/16."""
    bits = np.unpackbits(qh, axis=-1, bitorder="little")  # bit j of byte k at index 8k+j
    return bits.astype(np.uint8) << 4


def _q5_0(b):  # d:f16, qh[4], qs[16]
    q = (_nibbles(b[:, 6:22]).reshape(-1, 32) | _high_bits32(b[:, 2:6])).astype(np.int8) - np.int8(16)
    return q, _f16(b[:, 0:2]), None


def _q5_1(b):  # d:f16, m:f16, qh[4], qs[16]
    q = (_nibbles(b[:, 8:24]).reshape(-1, 32) | _high_bits32(b[:, 4:8])).astype(np.int8)
    return q, _f16(b[:, 0:2]), _f16(b[:, 2:4])


def _q8_0(b):  # d:f16, qs:int8[32]
    return b[:, 2:34].view(np.int8), _f16(b[:, 0:2]), None


def _iq4_nl(b):  # d:f16, qs[16] (indices into KVALUES_IQ4NL)
    return KVALUES_IQ4NL[_nibbles(b[:, 2:18]).reshape(-1, 32)], _f16(b[:, 0:2]), None


# --- 256-element super-block formats (k-quants) ---------------------------------------------

def _q2_k(b):  # scales[16] (lo: scale, hi: min), qs[64], d:f16, dmin:f16 -> 16 groups of 16
    n = b.shape[0]
    sc = b[:, 0:16]
    qs = b[:, 16:80].reshape(n, 2, 1, 32)  # two halves of 128; 32 bytes each carry 4 crumbs
    d, dmin = _f16(b[:, 80:82]), _f16(b[:, 82:84])
    dl = d * (sc & 0x0F).astype(np.float32)
    ml = dmin * (sc >> 4).astype(np.float32)
    # output index h*128 + j*32 + l takes bits 2j of qs[h*32 + l]; 16-element groups in order
    q = (qs >> (np.arange(4, dtype=np.uint8) * 2).reshape(1, 1, 4, 1)) & 3
    return q.reshape(n, QK_K).astype(np.int8), dl, -ml  # dl*q - ml


def _q3_k(b):  # hmask[32], qs[64], scales[12] (16 x 6 bit), d:f16 -> 16 groups of 16
    n = b.shape[0]
    hm = b[:, 0:32].reshape(n, 1, 32)
    qs = b[:, 32:96].reshape(n, 2, 1, 32)
    s = b[:, 96:108]
    d = _f16(b[:, 108:110])
    # scale i: low 4 bits from byte i%8 (nibble i//8), high 2 bits from byte 8+i%4 (bits 2*(i//4))
    i = np.arange(16)
    lo = (s[:, i % 8] >> (4 * (i // 8)).astype(np.uint8)) & 0x0F
    hi = (s[:, 8 + i % 4] >> (2 * (i // 4)).astype(np.uint8)) & 0x03
    scale = (lo | (hi << 4)).astype(np.int8) - np.int8(32)
    low = (qs >> (np.arange(4, dtype=np.uint8) * 2).reshape(1, 1, 4, 1)) & 3  # [n, 2, 4, 32]
    # hmask bit (h*4 + j) of byte l: set means no -4 offset
    hbit = (hm >> np.arange(8, dtype=np.uint8).reshape(1, 8, 1)) & 1  # [n, 8, 32]
    q = low.reshape(n, 8, 32).astype(np.int8) - ((hbit ^ 1) << 2).astype(np.int8)
    return q.reshape(n, QK_K), d * scale.astype(np.float32), None


def _k4_scales(s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K/Q5_K: 12 bytes -> 8 six-bit scales and 8 six-bit mins (ggml get_scale_min_k4)."""
    a, m, hi = s[:, 0:4], s[:, 4:8], s[:, 8:12]
    sc = np.concatenate([a & 63, (hi & 0x0F) | ((a >> 6) << 4)], axis=1)
    mn = np.concatenate([m & 63, (hi >> 4) | ((m >> 6) << 4)], axis=1)
    return sc.astype(np.float32), mn.astype(np.float32)


def _q4_k(b):  # d:f16, dmin:f16, scales[12], qs[128] -> 8 groups of 32
    n = b.shape[0]
    d, dmin = _f16(b[:, 0:2]), _f16(b[:, 2:4])
    sc, mn = _k4_scales(b[:, 4:16])
    qs = b[:, 16:144].reshape(n, 4, 1, 32)
    # 64-element group j: low nibbles of qs[32j:32j+32] then high nibbles
    q = (qs >> np.array([0, 4], dtype=np.uint8).reshape(1, 1, 2, 1)) & 0x0F
    return q.reshape(n, QK_K).astype(np.int8), d * sc, -(dmin * mn)  # (d*sc)*q - dmin*m


def _q5_k(b):  # d:f16, dmin:f16, scales[12], qh[32], qs[128] -> 8 groups of 32
    n = b.shape[0]
    d, dmin = _f16(b[:, 0:2]), _f16(b[:, 2:4])
    sc, mn = _k4_scales(b[:, 4:16])
    qh = b[:, 16:48].reshape(n, 1, 32)
    qs = b[:, 48:176].reshape(n, 4, 1, 32)
    low = ((qs >> np.array([0, 4], dtype=np.uint8).reshape(1, 1, 2, 1)) & 0x0F).reshape(n, 8, 32)
    high = ((qh >> np.arange(8, dtype=np.uint8).reshape(1, 8, 1)) & 1) << 4  # bit g for group g
    return (low | high).reshape(n, QK_K).astype(np.int8), d * sc, -(dmin * mn)


def _q6_k(b):  # ql[128], qh[64], scales:int8[16], d:f16 -> 16 groups of 16
    n = b.shape[0]
    ql = b[:, 0:128].reshape(n, 2, 1, 64)
    qh = b[:, 128:192].reshape(n, 2, 1, 32)
    sc = b[:, 192:208].view(np.int8).astype(np.float32)
    d = _f16(b[:, 208:210])
    # half h, quarter k (32 elements): low nibble k<2 / high nibble k>=2 of ql[h*64 + 32*(k%2) + l],
    # top two bits (2k) of qh[h*32 + l]
    low = ((ql >> np.array([0, 4], dtype=np.uint8).reshape(1, 1, 2, 1)) & 0x0F).reshape(n, 2, 4, 32)
    high = (qh >> (np.arange(4, dtype=np.uint8) * 2).reshape(1, 1, 4, 1)) & 3
    q = (low | (high << 4)).astype(np.int8) - np.int8(32)
    return q.reshape(n, QK_K), d * sc, None


def _iq4_xs(b):  # d:f16, scales_h:u16, scales_l[4], qs[128] -> 8 groups of 32
    n = b.shape[0]
    d = _f16(b[:, 0:2])
    sh = np.ascontiguousarray(b[:, 2:4]).view("<u2").astype(np.uint32)  # [n, 1]
    sl = b[:, 4:8]
    ib = np.arange(8)
    lo = (sl[:, ib // 2] >> (4 * (ib % 2)).astype(np.uint8)) & 0x0F
    hi = ((sh >> (2 * ib).astype(np.uint32)) & 3).astype(np.uint8)
    ls = (lo | (hi << 4)).astype(np.int8) - np.int8(32)
    return KVALUES_IQ4NL[_nibbles(b[:, 8:136])].reshape(n, QK_K), d * ls.astype(np.float32), None


_BLOCK_DECODE = {
    Q4_0: _q4_0, Q4_1: _q4_1, Q5_0: _q5_0, Q5_1: _q5_1, Q8_0: _q8_0, IQ4_NL: _iq4_nl,
    Q2_K: _q2_k, Q3_K: _q3_k, Q4_K: _q4_k, Q5_K: _q5_k, Q6_K: _q6_k, IQ4_XS: _iq4_xs,
}


def _combine(q: np.ndarray, scale: np.ndarray, minv: np.ndarray | None) -> np.ndarray:
    """scale * q (+ minv) per group, float32 (one rounding each, as ggml)."""
    n, ng = scale.shape
    w = scale[:, :, None] * q.reshape(n, ng, -1).astype(np.float32)
    if minv is not None:
        w += minv[:, :, None]
    return w.reshape(q.shape)


SUPPORTED_TYPES = frozenset({F32, F16, BF16, *_BLOCK_DECODE})


def dequantize(data: np.ndarray, ggml_type: int, shape) -> np.ndarray:
    """Decode a tensor's raw bytes (uint8, GGUF layout) into a float32 array of `shape`
    (numpy order: the last axis is the GGML row, ne[0])."""
    shape = tuple(int(s) for s in shape)
    if ggml_type not in SUPPORTED_TYPES:
        raise UnsupportedModelError(f"tensor type {type_name(ggml_type)} is not supported "
                                    f"(memra dequantizes {', '.join(sorted(type_name(t) for t in SUPPORTED_TYPES))})")
    bs, ts = block_info(ggml_type)
    n_el = int(np.prod(shape, dtype=np.int64))
    if not shape or shape[-1] % bs:
        raise MemraError(f"{type_name(ggml_type)} tensor of shape {shape}: row length is not a "
                         f"multiple of the block size {bs}")
    raw = np.asarray(data).reshape(-1)
    if raw.dtype != np.uint8:
        raise MemraError(f"dequantize expects uint8 bytes, got {raw.dtype}")
    expected = n_el // bs * ts
    if raw.size != expected:
        raise MemraError(f"{type_name(ggml_type)} tensor of shape {shape}: expected {expected} bytes, "
                         f"found {raw.size}")
    if ggml_type == F32:
        return raw.view("<f4").astype(np.float32).reshape(shape)
    if ggml_type == F16:
        return raw.view("<f2").astype(np.float32).reshape(shape)
    if ggml_type == BF16:
        return (raw.view("<u2").astype(np.uint32) << 16).view(np.float32).reshape(shape)

    blocks = raw.reshape(-1, ts)
    fn = _BLOCK_DECODE[ggml_type]
    out = np.empty((blocks.shape[0], bs), dtype=np.float32)
    for i in range(0, blocks.shape[0], _CHUNK_BLOCKS):
        out[i:i + _CHUNK_BLOCKS] = _combine(*fn(np.asarray(blocks[i:i + _CHUNK_BLOCKS])))
    return out.reshape(shape)


# byte offsets of each block format's float16 fields (d, and dmin or m where it has one): a
# block's values are finite exactly when these are (its codes and sub-scales are small integers);
# random valid blocks (memra.gpu.ops.matvec.random_weight) write finite values there
F16_FIELDS = {
    Q4_0: (0,), Q4_1: (0, 2), Q5_0: (0,), Q5_1: (0, 2), Q8_0: (0,), IQ4_NL: (0,),
    Q2_K: (80, 82), Q3_K: (108,), Q4_K: (0, 2), Q5_K: (0, 2), Q6_K: (208,), IQ4_XS: (0,),
}
# (bytes, exponent mask) of the float formats: all exponent bits set is an infinity or a NaN
_FLOAT_BITS = {F32: ("<u4", 0x7F800000), F16: ("<u2", 0x7C00), BF16: ("<u2", 0x7F80)}


def first_nonfinite_row(t: TensorInfo) -> int | None:
    """The first row of a tensor holding a NaN or an infinity (a corrupt file), None when every
    value is finite; reads only the float fields (a block format's scales), not the codes."""
    raw = np.asarray(t.data).reshape(-1)
    if t.ggml_type in _FLOAT_BITS:
        dtype, mask = _FLOAT_BITS[t.ggml_type]
        words, fields = raw.view(dtype).reshape(t.rows, -1), (None,)
    elif t.ggml_type in F16_FIELDS:
        bs, ts = block_info(t.ggml_type)
        words, mask = raw.view("<u2").reshape(t.rows, -1, ts // 2), 0x7C00
        fields = tuple(off // 2 for off in F16_FIELDS[t.ggml_type])
    else:
        return None  # a type memra does not read: its reader names it
    step = max(1, (1 << 22) // max(1, words[0].size))  # rows a pass: bounded temporaries
    for r in range(0, t.rows, step):
        w = words[r:r + step]
        bad = np.zeros(w.shape[:2], bool)
        for f in fields:
            bad |= ((w if f is None else w[..., f]) & mask) == mask
        rows = np.flatnonzero(bad.any(axis=1))
        if rows.size:
            return r + int(rows[0])
    return None


class Codes(NamedTuple):
    """A block-quantized matrix re-laid as int8 codes with float32 scale (and offset) per group
    of `group` consecutive elements of a row: w = scale * q (+ minv), exactly ggml's values."""
    q: np.ndarray  # int8 [rows, cols]
    scale: np.ndarray  # float32 [rows, cols // group]
    minv: np.ndarray | None  # float32 [rows, cols // group] (Q4_1, Q5_1, Q2_K, Q4_K, Q5_K)
    group: int

    def dequantize(self) -> np.ndarray:
        rows, cols = self.q.shape
        out = np.empty((rows, cols), np.float32)
        step = max(1, (_CHUNK_BLOCKS * 32) // cols)
        for r in range(0, rows, step):
            out[r:r + step] = _combine(self.q[r:r + step], self.scale[r:r + step],
                                       None if self.minv is None else self.minv[r:r + step])
        return out


def decompose(data: np.ndarray, ggml_type: int, shape) -> Codes:
    """A 2-D block-quantized tensor (rows, cols) as `Codes`; dequantize() == Codes.dequantize()."""
    rows, cols = (int(s) for s in shape)
    if ggml_type not in _BLOCK_DECODE:
        raise UnsupportedModelError(f"decompose: {type_name(ggml_type)} is not a block-quantized type")
    bs, ts = block_info(ggml_type)
    raw = np.asarray(data).reshape(-1)
    if cols % bs or raw.size != rows * cols // bs * ts:
        raise MemraError(f"{type_name(ggml_type)} tensor of shape {(rows, cols)}: expected "
                         f"{rows * cols // bs * ts} bytes, found {raw.size}")
    blocks = raw.reshape(-1, ts)
    fn = _BLOCK_DECODE[ggml_type]
    parts = [fn(np.asarray(blocks[i:i + _CHUNK_BLOCKS])) for i in range(0, blocks.shape[0], _CHUNK_BLOCKS)]
    q = np.concatenate([p[0] for p in parts]).reshape(rows, cols)
    scale = np.concatenate([p[1] for p in parts]).astype(np.float32, copy=False)
    group = bs // scale.shape[1]
    minv = None if parts[0][2] is None else np.concatenate([p[2] for p in parts]).reshape(rows, -1)
    return Codes(np.ascontiguousarray(q, dtype=np.int8), scale.reshape(rows, -1), minv, group)


def dequantize_tensor(t: TensorInfo) -> np.ndarray:
    """A GGUF tensor as float32 in its numpy shape; errors name the tensor."""
    try:
        return dequantize(t.data, t.ggml_type, t.shape)
    except MemraError as e:
        raise type(e)(f"tensor {t.name!r}: {e}") from None


def dequantize_rows(t: TensorInfo, rows) -> np.ndarray:
    """Selected rows of a 2-D tensor (e.g. token embeddings) without decoding the rest."""
    rows = np.asarray(rows, dtype=np.int64)
    rb = t.row_bytes()
    raw = t.data.reshape(t.rows, rb)[rows]
    return dequantize(raw, t.ggml_type, (len(rows), t.cols))


# --- activation quantizers (what ggml does to activations before integer dot products) ---

def roundf(x: np.ndarray) -> np.ndarray:
    """C roundf: round half away from zero (numpy's rint rounds half to even)."""
    return np.copysign(np.floor(np.abs(x) + np.float32(0.5)), x)


class Q8Blocks(NamedTuple):
    """Activations quantized in blocks of 32: x ≈ d * qs.

    qs: int8 [..., n/32, 32]; d: float32 [..., n/32] (the unrounded scale used to quantize;
    the block stores it as f16, see `to_bytes`); s: float32 [..., n/32] = d * sum(qs)
    (q8_1 only; zeros for q8_0).
    """
    qs: np.ndarray
    d: np.ndarray
    s: np.ndarray

    def to_bytes(self, ggml_type: int) -> np.ndarray:
        """GGML byte layout: block_q8_0 {f16 d; int8 qs[32]} (34 B) or block_q8_1
        {f16 d; f16 s; int8 qs[32]} (36 B), shape [..., n/32 * bytes]."""
        lead = self.qs.shape[:-2]
        nb = self.qs.shape[-2]
        d = self.d.astype("<f2").view(np.uint8).reshape(*lead, nb, 2)
        q = self.qs.view(np.uint8)
        if ggml_type == Q8_0:
            parts = [d, q]
        elif ggml_type == Q8_1:
            parts = [d, self.s.astype("<f2").view(np.uint8).reshape(*lead, nb, 2), q]
        else:
            raise MemraError(f"to_bytes: {type_name(ggml_type)} is not an activation format")
        return np.concatenate(parts, axis=-1).reshape(*lead, -1)


def _quantize_q8(x: np.ndarray, with_sum: bool) -> Q8Blocks:
    x = np.asarray(x, dtype=np.float32)
    if x.ndim == 0 or x.shape[-1] % 32:
        raise MemraError(f"q8 quantization needs a last axis that is a multiple of 32, got {x.shape}")
    xb = x.reshape(*x.shape[:-1], x.shape[-1] // 32, 32)
    amax = np.max(np.abs(xb), axis=-1)
    d = amax / np.float32(127)
    with np.errstate(divide="ignore"):
        inv = np.where(d != 0, np.float32(1) / d, np.float32(0)).astype(np.float32)
    qs = roundf(xb * inv[..., None]).astype(np.int8)
    if with_sum:
        # ggml sums the int8 values exactly, then multiplies by the f32 scale
        s = qs.astype(np.int32).sum(axis=-1).astype(np.float32) * d
    else:
        s = np.zeros_like(d)
    return Q8Blocks(qs, d.astype(np.float32), s.astype(np.float32))


def quantize_q8_0(x: np.ndarray) -> Q8Blocks:
    """ggml quantize_row_q8_0_ref over the last axis (multiple of 32)."""
    return _quantize_q8(x, with_sum=False)


def quantize_q8_1(x: np.ndarray) -> Q8Blocks:
    """ggml quantize_row_q8_1_ref over the last axis: as q8_0 plus s = d * sum(qs)."""
    return _quantize_q8(x, with_sum=True)
