"""ref.py — CPU references of build/matvec.cu's arms (bit for bit), numpy float32 with explicit roundings.

    slot order (MV_FOLD 1, MV_CHAINF 1)    memra.gpu.chain.slot_chain
    mv_q8 today (MV_FOLD 0, MV_CHAINF 0)   emulate(..., fold=0): T::accum per unit (qtypes.cuh), lane slot l = units
                                           l, l + 32, ..., then warp_sum's xor butterfly
    fold alone  (MV_FOLD 1, MV_CHAINF 0)   emulate(..., fold=1): the same slots, left fold ((s_0 + s_1) + s_2) + ...

Inputs as memra.gpu.chain: raw GGUF rows (uint8 [rows, row bytes]), q8 activations qx (int8 [nb, K]), dx
(float32 [nb, K / 32]), S (int [nb, K / 32]). Outputs [nb, rows] float32. `arm_ref` adds the epilogues
(act(gate) * up for a [gate; up] weight, + residual), each one float32 rounding like the kernel.
"""
from __future__ import annotations

import numpy as np

from memra.gpu.chain import fma32, slot_chain
from memra.model import quants as Q

F = np.float32
TYPES = (2, 8, 12, 14)   # Q4_0, Q8_0, Q4_K, Q6_K


def _f16(raw, rows, ts, off):
    b = np.ascontiguousarray(raw.reshape(rows, -1, ts)[:, :, off:off + 2])
    return b.view("<f2")[..., 0].astype(F)


def _k4_scale_min(raw, rows):
    """Q4_K 6-bit scales and mins [rows, K / 32] (ggml's get_scale_min_k4 / qtypes.cuh scale_min_k4)."""
    s = raw.reshape(rows, -1, 144)[:, :, 4:16].astype(np.int64)
    sc, mn = np.empty(s.shape[:2] + (8,), np.int64), np.empty(s.shape[:2] + (8,), np.int64)
    for j in range(8):
        if j < 4:
            sc[..., j], mn[..., j] = s[..., j] & 63, s[..., j + 4] & 63
        else:
            sc[..., j] = (s[..., j + 4] & 0xF) | ((s[..., j - 4] >> 6) << 4)
            mn[..., j] = (s[..., j + 4] >> 4) | ((s[..., j] >> 6) << 4)
    return sc.reshape(rows, -1), mn.reshape(rows, -1)


def _unit_accum(raw, t, qx, dx, S):
    """(nu, step): step(acc, u) = T::accum(acc, unit u) for acc [rows, nb] float32, as qtypes.cuh writes it."""
    raw = np.ascontiguousarray(raw, np.uint8)
    rows, (nb, K) = raw.shape[0], qx.shape
    nblk, nu = K // 32, K // 64
    codes = Q.decompose(raw, t, (rows, K))
    w, x = codes.q.astype(np.int64), qx.astype(np.int64)
    dx = np.asarray(dx, F)
    Sx = np.asarray(S, np.int64)
    if t in (2, 8):
        I = np.einsum("rik,bik->rbi", w.reshape(rows, nblk, 32), x.reshape(nb, nblk, 32))   # Q4_0: the (q - 8) dot
        d = codes.scale                                                                      # [rows, nblk]

        def step(acc, u):
            r = np.zeros_like(acc)
            for i in (2 * u, 2 * u + 1):
                r = fma32(d[:, i, None] * dx[None, :, i], I[:, :, i].astype(F), r)
            return acc + r
        return nu, step
    if t == 12:
        I = np.einsum("rik,bik->rbi", w.reshape(rows, nblk, 32), x.reshape(nb, nblk, 32))   # q in 0..15
        sc, mn = _k4_scale_min(raw, rows)
        d, dmin = _f16(raw, rows, 144, 0), _f16(raw, rows, 144, 2)

        def step(acc, u):
            sb, (i0, i1) = u // 4, (2 * u, 2 * u + 1)
            ab = []
            for i in (i0, i1):
                my = dmin[:, sb, None] * (mn[:, i, None] * Sx[None, :, i]).astype(F)
                ab.append(fma32(d[:, sb, None], (sc[:, i, None] * I[:, :, i]).astype(F), -my))
            return acc + fma32(ab[0], dx[None, :, i0], ab[1] * dx[None, :, i1])
        return nu, step
    if t == 14:
        I16 = np.einsum("rhk,bhk->rbh", w.reshape(rows, -1, 16), x.reshape(nb, -1, 16))     # q - 32, [rows, nb, K / 16]
        sc16 = raw.reshape(rows, -1, 210)[:, :, 192:208].view(np.int8).astype(np.int64).reshape(rows, -1)
        d = _f16(raw, rows, 210, 208)

        def step(acc, u):
            sb, j = u // 4, u % 4
            r = np.zeros_like(acc)
            for g in range(4):   # group g of mv's unit: 16-half h = 16 sb + 8 n + 2 g + (j & 1)
                h = 16 * sb + 8 * (j // 2) + 2 * g + (j & 1)
                r = fma32(dx[None, :, h // 2], (sc16[:, h, None] * I16[:, :, h]).astype(F), r)
            return fma32(d[:, sb, None], r, acc)
        return nu, step
    raise ValueError(f"ref: type {t} not emulated (have {TYPES})")


def lane_slots(raw, t, qx, dx, S) -> np.ndarray:
    """[32, rows, nb]: lane l's partial of today's mv_q8 (units l, l + 32, ... by T::accum, from +0)."""
    nu, step = _unit_accum(raw, t, qx, dx, S)
    out = np.zeros((32, raw.shape[0], qx.shape[0]), F)
    for l in range(min(32, nu)):
        for u in range(l, nu, 32):
            out[l] = step(out[l], u)
    return out


def butterfly(v: np.ndarray) -> np.ndarray:
    """warp_sum (common.cuh): v[l] += v[l ^ o] for o = 16, 8, 4, 2, 1; lane 0's value."""
    v = v.copy()
    idx = np.arange(32)
    for o in (16, 8, 4, 2, 1):
        v = v + v[idx ^ o]
    return v[0]


def left_fold(v: np.ndarray) -> np.ndarray:
    """((v_0 + v_1) + v_2) + ... + v_31, float32 adds."""
    tot = v[0]
    for l in range(1, 32):
        tot = tot + v[l]
    return tot


def emulate(raw, t, qx, dx, S, fold: int) -> np.ndarray:
    """mv_q8's T::accum lane slots combined by the butterfly (fold 0) or the left fold (fold 1): [nb, rows]."""
    v = lane_slots(raw, t, qx, dx, S)
    return (left_fold(v) if fold else butterfly(v)).T


def arm_raw(raw, t, qx, dx, S, fold: int, chainf: int) -> np.ndarray:
    """[nb, rows] of one arm before the epilogue."""
    if chainf:
        if not fold:
            raise ValueError("ref: MV_CHAINF 1 is checked only with MV_FOLD 1 (the slot order)")
        return slot_chain(raw, t, qx, dx, S)
    return emulate(raw, t, qx, dx, S, fold)


def silu_mul(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    """fl(silu(gate) * up) in float32 numpy (the device's expf may differ by an ulp: compared with a tolerance)."""
    with np.errstate(over="ignore"):
        g = gate.astype(F)
        return (g / (F(1) + np.exp(-g))) * up.astype(F)


def arm_ref(raw, t, qx, dx, S, fold: int, chainf: int, glu: bool = False, residual=None) -> np.ndarray:
    """[nb, N]: the arm with its epilogue (glu: raw holds [gate; up], 2N rows; residual [nb, N])."""
    y = arm_raw(raw, t, qx, dx, S, fold, chainf)
    if glu:
        n = y.shape[1] // 2
        y = silu_mul(y[:, :n], y[:, n:])
    if residual is not None:
        y = y + np.asarray(residual, F)
    return y.astype(F)


def float64_ref(raw, t, qx, dx) -> np.ndarray:
    """[nb, rows] float64: dequant(W) @ (dx qx)."""
    rows, (nb, K) = raw.shape[0], qx.shape
    wf = Q.dequantize(np.ascontiguousarray(raw).reshape(-1), t, (rows, K)).astype(np.float64)
    xv = (qx.reshape(nb, -1, 32).astype(np.float64) * np.asarray(dx, np.float64)[..., None]).reshape(nb, K)
    return xv @ wf.T
