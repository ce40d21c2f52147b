"""Dequantization and activation quantizers against gguf.quants (the library is the reference)."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import quants as gq
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType as T

from memra.model import quants
from memra.errors import MemraError, UnsupportedModelError

BLOCK_TYPES = [T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K,
               T.IQ4_NL, T.IQ4_XS]

# byte offsets of the f16 scale fields in each block, which must hold finite values
F16_FIELDS = {
    T.Q4_0: [0], T.Q4_1: [0, 2], T.Q5_0: [0], T.Q5_1: [0, 2], T.Q8_0: [0], T.IQ4_NL: [0],
    T.Q2_K: [80, 82], T.Q3_K: [108], T.Q4_K: [0, 2], T.Q5_K: [0, 2], T.Q6_K: [208], T.IQ4_XS: [0],
}


def random_blocks(qtype: T, n_blocks: int, rng: np.random.Generator) -> np.ndarray:
    """Random bytes (every bit pattern of the quant fields) with finite, varied f16 scales."""
    _, ts = GGML_QUANT_SIZES[qtype]
    b = rng.integers(0, 256, size=(n_blocks, ts), dtype=np.uint8)
    for off in F16_FIELDS[qtype]:
        # magnitudes across the normal range and some subnormals, both signs
        scale = rng.standard_normal(n_blocks) * np.exp2(rng.integers(-20, 4, n_blocks))
        b[:, off:off + 2] = scale.astype("<f2").view(np.uint8).reshape(n_blocks, 2)
    return b


@pytest.mark.parametrize("qtype", BLOCK_TYPES, ids=lambda t: t.name)
def test_block_types_match_gguf(qtype):
    rng = np.random.default_rng(int(qtype))
    bs, ts = GGML_QUANT_SIZES[qtype]
    rows = 7
    n_blocks_row = 3 if bs == 256 else 9
    raw = random_blocks(qtype, rows * n_blocks_row, rng).reshape(rows, n_blocks_row * ts)
    want = gq.dequantize(raw, qtype)
    got = quants.dequantize(raw, int(qtype), (rows, n_blocks_row * bs))
    assert got.dtype == np.float32 and got.shape == want.shape
    # ggml's expression in ggml's order: bit-identical, not merely close
    np.testing.assert_array_equal(got.view(np.uint32), want.astype(np.float32).view(np.uint32))


@pytest.mark.parametrize("qtype", BLOCK_TYPES, ids=lambda t: t.name)
def test_codes_are_the_same_weights(qtype):
    """decompose(): int8 codes and per-group scale/offset whose weights are bit-identical."""
    rng = np.random.default_rng(100 + int(qtype))
    bs, ts = GGML_QUANT_SIZES[qtype]
    rows, nb = 5, 2 if bs == 256 else 6
    raw = random_blocks(qtype, rows * nb, rng).reshape(rows, nb * ts)
    c = quants.decompose(raw, int(qtype), (rows, nb * bs))
    assert c.q.dtype == np.int8 and c.q.shape == (rows, nb * bs) and c.scale.shape == (rows, nb * bs // c.group)
    want = gq.dequantize(raw, qtype).astype(np.float32)
    np.testing.assert_array_equal(c.dequantize().view(np.uint32), want.view(np.uint32))
    # and by the stated formula, group by group
    w = c.scale.repeat(c.group, axis=1) * c.q.astype(np.float32)
    if c.minv is not None:
        w = w + c.minv.repeat(c.group, axis=1)
    np.testing.assert_array_equal(w.view(np.uint32), want.view(np.uint32))


@pytest.mark.parametrize("qtype", [T.F32, T.F16, T.BF16], ids=lambda t: t.name)
def test_float_types_match_gguf(qtype):
    rng = np.random.default_rng(1)
    x = (rng.standard_normal((5, 64)) * 100).astype(np.float32)
    raw = gq.quantize(x, qtype) if qtype != T.F32 else x
    raw = np.ascontiguousarray(raw).view(np.uint8).reshape(5, -1)
    want = gq.dequantize(raw, qtype) if qtype != T.F32 else x
    got = quants.dequantize(raw, int(qtype), (5, 64))
    np.testing.assert_array_equal(got, np.asarray(want, dtype=np.float32).reshape(5, 64))


def test_hand_computed_q4_0_and_q8_0():
    # Q4_0: d = 0.5, byte j = (j & 15) | (15 - j) << 4 -> x[j] = (j - 8) * 0.5, x[16+j] = (7 - j) * 0.5
    blk = np.zeros(18, np.uint8)
    blk[0:2] = np.array([0.5], "<f2").view(np.uint8)
    j = np.arange(16)
    blk[2:] = (j | ((15 - j) << 4)).astype(np.uint8)
    got = quants.dequantize(blk, int(T.Q4_0), (32,))
    np.testing.assert_array_equal(got, np.concatenate([(j - 8) * 0.5, (7 - j) * 0.5]).astype(np.float32))
    # Q8_0: d = -2, qs = -128..-97
    blk = np.zeros(34, np.uint8)
    blk[0:2] = np.array([-2.0], "<f2").view(np.uint8)
    blk[2:] = np.arange(-128, -96, dtype=np.int8).view(np.uint8)
    np.testing.assert_array_equal(quants.dequantize(blk, int(T.Q8_0), (32,)),
                                  np.arange(-128, -96) * -2.0)


def test_large_tensor_crosses_chunks():
    rng = np.random.default_rng(3)
    n = quants._CHUNK_BLOCKS * 2 + 5
    raw = random_blocks(T.Q8_0, n, rng)
    got = quants.dequantize(raw, int(T.Q8_0), (n, 32))
    np.testing.assert_array_equal(got, gq.dequantize(raw, T.Q8_0))


def test_errors():
    with pytest.raises(UnsupportedModelError, match="IQ2_XXS"):
        quants.dequantize(np.zeros(66, np.uint8), int(T.IQ2_XXS), (256,))
    with pytest.raises(MemraError, match="expected 68 bytes, found 35"):
        quants.dequantize(np.zeros(35, np.uint8), int(T.Q8_0), (2, 32))
    with pytest.raises(MemraError, match="multiple of the block size 32"):
        quants.dequantize(np.zeros(34, np.uint8), int(T.Q8_0), (2, 16))


def test_dequantize_tensor_and_rows_on_real_model():
    from memra.model.aliases import resolve
    from memra.model.gguf import open_gguf

    g = open_gguf(resolve("smollm2-135m"))
    t = g.tensor("blk.0.attn_q.weight")  # Q4_1
    full = quants.dequantize_tensor(t)
    np.testing.assert_array_equal(full, gq.dequantize(np.asarray(t.data).reshape(t.rows, -1), t.ggml_type))
    e = g.tensor("token_embd.weight")  # Q8_0
    rows = [0, 5, 49151, 5]
    want = gq.dequantize(np.asarray(e.data).reshape(e.rows, -1)[rows], e.ggml_type)
    np.testing.assert_array_equal(quants.dequantize_rows(e, rows), want)


# --- activation quantizers -------------------------------------------------------------------

def test_quantize_q8_0_matches_gguf_bytes():
    rng = np.random.default_rng(4)
    x = (rng.standard_normal((6, 128)) * rng.exponential(3, (6, 1))).astype(np.float32)
    x[2, 32:64] = 0  # an all-zero block: d = 0, qs = 0
    q = quants.quantize_q8_0(x)
    want = gq.quantize(x, T.Q8_0)  # gguf mirrors ggml's quantize_row_q8_0_ref
    np.testing.assert_array_equal(q.to_bytes(int(T.Q8_0)), want)


def test_quantize_q8_1_values_and_sums():
    rng = np.random.default_rng(5)
    x = (rng.standard_normal((3, 96)) * 5).astype(np.float32)
    q1, q0 = quants.quantize_q8_1(x), quants.quantize_q8_0(x)
    # the int8 values and scale are those of q8_0 (same ggml recipe), checked above against gguf
    np.testing.assert_array_equal(q1.qs, q0.qs)
    np.testing.assert_array_equal(q1.d, q0.d)
    # s = d * sum(qs), computed independently here in float64 then rounded
    s = (q1.qs.astype(np.float64).sum(-1) * q1.d).astype(np.float32)
    np.testing.assert_array_equal(q1.s, s)
    b = q1.to_bytes(int(T.Q8_1)).reshape(3, 3, 36)
    np.testing.assert_array_equal(b[..., 0:2].copy().view("<f2")[..., 0], q1.d.astype(np.float16))
    np.testing.assert_array_equal(b[..., 2:4].copy().view("<f2")[..., 0], q1.s.astype(np.float16))
    np.testing.assert_array_equal(b[..., 4:].view(np.int8), q1.qs)


def test_q8_rounds_half_away_from_zero():
    # amax = 127 -> d = 1, so x * (1/d) = x exactly: halves must go away from zero
    x = np.zeros(32, np.float32)
    x[:6] = [127, 0.5, -0.5, 1.5, -2.5, 2.4999998]
    q = quants.quantize_q8_1(x)
    assert q.d[0] == 1.0
    assert q.qs[0, :6].tolist() == [127, 1, -1, 2, -3, 2]
    assert q.s[0] == 127 + 1 - 1 + 2 - 3 + 2


def _tensor(raw: np.ndarray, qtype: int, rows: int, cols: int):
    from memra.model.gguf import TensorInfo
    return TensorInfo("t", int(qtype), (rows, cols), 0, raw.size, raw.reshape(-1))


@pytest.mark.parametrize("qtype", BLOCK_TYPES + [T.F32, T.F16, T.BF16], ids=lambda t: t.name)
def test_first_nonfinite_row_agrees_with_dequantize(qtype):
    """The scan of the float fields against gguf's dequantization + isfinite: a NaN or an
    infinity written into one field (or none) of a random tensor."""
    rng = np.random.default_rng(100 + int(qtype))
    bs, ts = GGML_QUANT_SIZES[qtype]
    rows, per_row = 6, (2 if bs == 256 else 4)
    cols = per_row * bs
    for trial in range(12):
        if qtype in BLOCK_TYPES:
            raw = random_blocks(qtype, rows * per_row, rng).reshape(-1)
            fields = [b * ts + off for b in range(rows * per_row) for off in F16_FIELDS[qtype]]
            width = 2
        else:
            width = {T.F32: 4, T.F16: 2, T.BF16: 2}[qtype]
            vals = rng.standard_normal(rows * cols).astype(np.float32)
            raw = {T.F32: lambda v: v, T.F16: lambda v: v.astype("<f2"),
                   T.BF16: lambda v: (v.view("<u4") >> 16).astype("<u2")}[qtype](vals).view(np.uint8).copy()
            fields = list(range(0, raw.size, width))
        if trial % 4:  # one field made an infinity or a NaN (trial 0, 4, 8: all finite)
            pos = fields[int(rng.integers(len(fields)))]
            nonfinite = rng.choice([np.inf, -np.inf, np.nan])
            v = np.array([nonfinite], np.float32)
            pattern = {T.F32: v, T.BF16: (v.view("<u4") >> 16).astype("<u2")}.get(qtype, v.astype("<f2"))
            raw[pos:pos + width] = pattern.view(np.uint8)
        with np.errstate(invalid="ignore", over="ignore"):
            oracle = gq.dequantize(raw.reshape(rows, -1), qtype).reshape(rows, cols)
        want = np.flatnonzero(~np.isfinite(oracle).all(axis=1))
        got = quants.first_nonfinite_row(_tensor(raw, qtype, rows, cols))
        assert got == (int(want[0]) if want.size else None), (trial, got, want)
        assert (got is None) == (trial % 4 == 0)
