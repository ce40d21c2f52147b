"""memra.gpu.chain: the exact float32 fma against rational arithmetic, and the chain of every type
against an independent scalar transcription (Fractions, one rounding per operation) and the
float64 product."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

from memra.gpu import chain as C
from memra.gpu.ops import matvec as MV
from memra.gpu.q8 import quantize_q8_ref
from memra.model import quants as Q


def _round32(v: Fraction) -> float:
    """A rational rounded to float32, nearest even (normal and subnormal range; +0 for 0)."""
    if v == 0:
        return 0.0
    neg, v = v < 0, abs(v)
    e = v.numerator.bit_length() - v.denominator.bit_length()
    if Fraction(2) ** e > v:
        e -= 1
    q = Fraction(2) ** (max(e, -126) - 23)
    m = v / q
    n = m.numerator // m.denominator
    rem = m - n
    if rem > Fraction(1, 2) or (rem == Fraction(1, 2) and n % 2):
        n += 1
    return -float(n * q) if neg else float(n * q)


def _fma(a, b, c) -> float:
    return _round32(Fraction(float(a)) * Fraction(float(b)) + Fraction(float(c)))


def test_fma32_against_rationals():
    rng = np.random.default_rng(3)
    n = 1500
    a = (rng.standard_normal(n) * 2.0 ** rng.integers(-20, 20, n)).astype(np.float32)
    b = (rng.standard_normal(n) * 2.0 ** rng.integers(-20, 20, n)).astype(np.float32)
    c = (rng.standard_normal(n) * 2.0 ** rng.integers(-40, 40, n)).astype(np.float32)
    c[: n // 3] = (-(a[: n // 3].astype(np.float64) * b[: n // 3]) * (1 + rng.standard_normal(n // 3) * 2.0 ** -20)).astype(np.float32)
    got = C.fma32(a, b, c)
    want = np.array([_fma(x, y, z) for x, y, z in zip(a, b, c)], np.float32)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    # a double-rounding trap: a b on a float32 midpoint, c below float64's reach of it
    t = np.float32(1 + 2.0 ** -12)
    assert C.fma32(t, t, np.float32(2.0 ** -80)) == np.float32(1 + 2.0 ** -11 + 2.0 ** -23)
    assert np.float32(np.float64(t) * np.float64(t) + 2.0 ** -80) != np.float32(1 + 2.0 ** -11 + 2.0 ** -23)


def _scalar_step(raw: np.ndarray, t: int, q: np.ndarray, dx: np.ndarray, S: np.ndarray):
    """step(acc, n, b, i): output (n, b)'s accumulator with k32 block i chained in, from the
    dequantizer's own codes and scales (quants.decompose), every product and sum rounded once
    through Fractions."""
    rows, K = raw.shape[0], q.shape[1]
    codes = Q.decompose(raw, t, (rows, K))
    _, ts = Q.block_info(t)

    def step(acc, n, b, i):
        blk = raw[n].reshape(-1, ts)
        qq = codes.q[n, 32 * i:32 * i + 32].astype(int)
        xx = q[b, 32 * i:32 * i + 32].astype(int)
        if t == Q.Q6_K:
            sc = blk[i // 8, 192:208].view(np.int8).astype(int)
            d = float(blk[i // 8, 208:210].view("<f2")[0])
            j = 2 * (i % 8)
            J = sc[j] * int(qq[:16] @ xx[:16]) + sc[j + 1] * int(qq[16:] @ xx[16:])
            return _fma(_round32(J * Fraction(d)), dx[b, i], acc)
        scale = float(codes.scale[n, i])     # d (Q4_0, Q8_0) or d sc_j (Q4_K): exact
        acc = _fma(_round32(int(qq @ xx) * Fraction(scale)), dx[b, i], acc)
        if t == Q.Q4_K:
            sx = _round32(Fraction(float(dx[b, i])) * int(S[b, i]))
            acc = _fma(float(codes.minv[n, i]), sx, acc)
        return acc
    return step


def _scalar_chain(raw: np.ndarray, t: int, q: np.ndarray, dx: np.ndarray, S: np.ndarray) -> np.ndarray:
    step = _scalar_step(raw, t, q, dx, S)
    y = np.zeros((q.shape[0], raw.shape[0]), np.float32)
    for n in range(raw.shape[0]):
        for b in range(q.shape[0]):
            acc = 0.0
            for i in range(q.shape[1] // 32):
                acc = step(acc, n, b, i)
            y[b, n] = acc
    return y


def _scalar_slots(raw: np.ndarray, t: int, q: np.ndarray, dx: np.ndarray, S: np.ndarray) -> np.ndarray:
    """The slot order one output at a time: slot l = the units u = l, l + 32, ... (blocks 2u, 2u + 1)
    chained from 0, the 32 slot values added left to right, one rounding each."""
    step = _scalar_step(raw, t, q, dx, S)
    units = q.shape[1] // 64
    y = np.zeros((q.shape[0], raw.shape[0]), np.float32)
    for n in range(raw.shape[0]):
        for b in range(q.shape[0]):
            tot = 0.0
            for l in range(32):
                acc = 0.0
                for u in range(l, units, 32):
                    acc = step(step(acc, n, b, 2 * u), n, b, 2 * u + 1)
                tot = _round32(Fraction(tot) + Fraction(acc))
            y[b, n] = tot
    return y


def _against_oracles(order, scalar, t: int, rows: int, nb: int, K: int, seed: int):
    """order(...) on random weights and activations: bit for bit its scalar Fraction transcription,
    within 1e-5 of the float64 product. Returns raw, q, s, the outputs and the float64 product."""
    rng = np.random.default_rng(seed)
    raw = MV.random_weight(t, rows, K, rng)
    x = (rng.standard_normal((nb, K)) * rng.uniform(0.5, 4)).astype(np.float32)
    q, s = quantize_q8_ref(x)
    got = order(raw, t, q, s["d"], s["s"])
    want = scalar(raw, t, q, s["d"], s["s"])
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    xv = (q.reshape(nb, -1, 32).astype(np.float64) * s["d"][..., None]).reshape(nb, K)
    y64 = xv @ MV.dequant_rows(raw, t).astype(np.float64).T
    assert np.abs(got - y64).max() <= 1e-5 * np.abs(y64).max()
    return raw, q, s, got, y64


@pytest.mark.parametrize("t", C.TYPES)
def test_chain_bit_for_bit(t):
    K = 512
    raw, q, s, got, y64 = _against_oracles(C.chain, _scalar_chain, t, 5, 3, K, 10 + t)
    # the order is part of the contract: the blocks summed in reverse give other bits
    rev = C.chain(raw.reshape(5, -1, Q.block_info(t)[1])[:, ::-1].reshape(5, -1), t,
                  q.reshape(3, -1, Q.block_info(t)[0])[:, ::-1].reshape(3, K),
                  s["d"].reshape(3, -1, Q.block_info(t)[0] // 32)[:, ::-1].reshape(3, -1),
                  s["s"].reshape(3, -1, Q.block_info(t)[0] // 32)[:, ::-1].reshape(3, -1))
    assert np.abs(rev - y64).max() <= 1e-5 * np.abs(y64).max()
    assert not np.array_equal(rev.view(np.uint32), got.view(np.uint32))


def test_chain_out_epilogues():
    rng = np.random.default_rng(5)
    K, N = 256, 4
    raw = MV.random_weight(Q.Q4_K, 2 * N, K, rng)
    x = rng.standard_normal((2, K)).astype(np.float32)
    q, s = quantize_q8_ref(x)
    y = C.chain(raw, Q.Q4_K, q, s["d"], s["s"])
    res = rng.standard_normal((2, N)).astype(np.float32)
    out = C.chain_out(raw, Q.Q4_K, q, s["d"], s["s"], act=lambda g, u: g * u, residual=res)
    assert np.array_equal(out, (y[:, :N] * y[:, N:]).astype(np.float32) + res)


def test_chain_refuses_other_types():
    with pytest.raises(Exception, match="no chain for"):
        C.chain(np.zeros((1, 20), np.uint8), Q.Q4_1, np.zeros((1, 32), np.int8), np.ones((1, 1), np.float32),
                np.zeros((1, 1), np.int32))


@pytest.mark.parametrize("t", C.TYPES)
def test_slot_chain_bit_for_bit(t):
    """K = 2,560: 40 units, so slots 0-7 chain two units and 8-31 one."""
    _against_oracles(C.slot_chain, _scalar_slots, t, 3, 2, 2560, 20 + t)


def test_slot_chain_is_its_own_order():
    """One unit: the slot order is the chain (the other slots add +0); many units: another order."""
    rng = np.random.default_rng(8)
    raw = MV.random_weight(Q.Q8_0, 16, 64, rng)
    q, s = quantize_q8_ref(rng.standard_normal((3, 64)).astype(np.float32))
    one = C.slot_chain(raw, Q.Q8_0, q, s["d"], s["s"])
    assert np.array_equal(one.view(np.uint32), C.chain(raw, Q.Q8_0, q, s["d"], s["s"]).view(np.uint32))
    K = 4096
    raw = MV.random_weight(Q.Q4_K, 16, K, rng)
    q, s = quantize_q8_ref(rng.standard_normal((3, K)).astype(np.float32))
    a = C.slot_chain(raw, Q.Q4_K, q, s["d"], s["s"])
    b = C.chain(raw, Q.Q4_K, q, s["d"], s["s"])
    assert not np.array_equal(a.view(np.uint32), b.view(np.uint32))
    with pytest.raises(Exception, match="64-weight unit"):
        C.slot_chain(MV.random_weight(Q.Q8_0, 1, 32, rng), Q.Q8_0, q[:, :32], s["d"][:, :1], s["s"][:, :1])
