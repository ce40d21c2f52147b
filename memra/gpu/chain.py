"""The chain: a quantized product's outputs as one float32 chain each, on the CPU, bit for bit.

The tensor-core tile GEMM (experiments/tile_land, measured in research/2026-12-02-session16) computes
every output y[b, n] = W[n, :] . x[b, :] of int8-quantized activations (q8: 32 codes qx and a scale
dx a block, S = sum qx) as one accumulator over the k32 blocks i in increasing k, I_i the block's exact
integer dot (weights' integer codes q times qx):

    Q4_0, Q8_0   p = fl(I d)                    acc = fma(p, dx, acc)            (Q4_0: q - 8)
    Q4_K         p = fl(I (d sc_j))             acc = fma(p, dx, acc)
                                                acc = fma(-(dmin m_j), fl(dx S), acc)
    Q6_K         J = sc_a Ia + sc_b Ib (int)    acc = fma(fl(J d), dx, acc)      (Ia, Ib: the 16-halves)

from acc = +0, each product and sum rounded once to float32 (round to nearest even); d sc and
dmin m are exact in float32. `chain(raw, t, qx, dx, S)` is that, vectorized over rows and
activation rows with an exact float32 fma (`fma32`: the product is exact in float64, TwoSum gives
the error of the float64 sum, and a float64 sum lying exactly on a float32 rounding midpoint is
resolved by the error's sign). `chain_out` adds the epilogues: act(gate) * up for a [gate; up]
weight and + residual, each one rounding.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from memra.errors import MemraError
from memra.model import quants as Q

TYPES = (Q.Q4_0, Q.Q8_0, Q.Q4_K, Q.Q6_K)


def fma32(a, b, c) -> np.ndarray:
    """Correctly rounded float32 fma(a, b, c), elementwise (float32 arrays or scalars)."""
    a, b, c = (np.asarray(v, np.float32).astype(np.float64) for v in (a, b, c))
    ab = a * b                                   # exact: two 24-bit significands
    s = ab + c
    bb = s - ab                                  # TwoSum: s + e == ab + c exactly
    e = (ab - (s - bb)) + (c - bb)
    r = s.astype(np.float32)
    rd = r.astype(np.float64)
    toward = np.where(s > rd, np.inf, -np.inf).astype(np.float32)
    nbr = np.nextafter(r, toward)                # r's float32 neighbour on s's side
    mid = (rd != s) & ((rd + nbr.astype(np.float64)) * 0.5 == s) & (e != 0)
    lo, hi = np.minimum(r, nbr), np.maximum(r, nbr)
    return np.where(mid, np.where(e > 0, hi, lo), r).astype(np.float32)


def _f16(raw: np.ndarray, off: int, size: int) -> np.ndarray:
    """The f16 at byte `off` of every `size`-byte block of each row, as float32 [rows, blocks]."""
    rows = raw.shape[0]
    b = raw.reshape(rows, -1, size)[:, :, off:off + 2]
    return np.ascontiguousarray(b).view("<f2")[..., 0].astype(np.float32)


def _operands(raw: np.ndarray, t: int, qx: np.ndarray, dx: np.ndarray, S: np.ndarray) -> dict:
    """The chain's per-block operands, for the compiled chain and the numpy step alike:
    I [rows, nb, groups] (float64, exact integers: |I| < 2^22) the groups' integer dots (32-wide;
    Q6_K: 16-wide), dx [nb, nblk]; Q4_0 / Q8_0 / Q4_K: scale [rows, nblk] (d or d sc_j) and, for
    Q4_K, ndmm [rows, nblk] = -(dmin m_j) and sx [nb, nblk] = fl(dx S) (else empty [0, 0]); Q6_K:
    sc [rows, 2 nblk] (int8 scales as float64) and d [rows, nblk] (the super-block's d of block i).
    MemraError for a type without a chain or rows that do not hold K."""
    if t not in TYPES:
        raise MemraError(f"chain: no chain for {Q.type_name(t)} (it has {', '.join(Q.type_name(v) for v in TYPES)})")
    raw = np.ascontiguousarray(raw, np.uint8)
    nb, K = qx.shape
    rows, nblk = raw.shape[0], K // 32
    bs, ts = Q.block_info(t)
    if K % bs or raw.shape[1] != K // bs * ts:
        raise MemraError(f"chain: {Q.type_name(t)} rows of {raw.shape[1]} bytes do not hold K = {K}")
    codes = Q.decompose(raw, t, (rows, K))   # the dequantizer's integer codes and per-group scalars
    g = 16 if t == Q.Q6_K else 32
    w = codes.q.astype(np.float64).reshape(rows, K // g, g).transpose(1, 0, 2)
    x = np.asarray(qx, np.float64).reshape(nb, K // g, g).transpose(1, 2, 0)
    op = {"I": np.ascontiguousarray(np.matmul(w, x).transpose(1, 2, 0)),       # [rows, nb, K / g]
          "dx": np.ascontiguousarray(dx, np.float32).reshape(nb, nblk)}
    if t == Q.Q6_K:
        sc = raw.reshape(rows, -1, ts)[:, :, 192:208].view(np.int8).astype(np.float64).reshape(rows, -1)
        op.update(sc=np.ascontiguousarray(sc), d=np.ascontiguousarray(np.repeat(_f16(raw, 208, ts), 8, axis=1)))
    else:
        op["scale"] = np.ascontiguousarray(codes.scale, np.float32)
        if codes.minv is None:
            op["ndmm"] = op["sx"] = np.zeros((0, 0), np.float32)
        else:
            op["ndmm"] = np.ascontiguousarray(codes.minv, np.float32)
            op["sx"] = (op["dx"].astype(np.float64) * np.asarray(S, np.float64).reshape(nb, nblk)).astype(np.float32)
    return op


def _block_step(raw: np.ndarray, t: int, qx: np.ndarray, dx: np.ndarray, S: np.ndarray):
    """(step, rows, nb, nblk): step(acc, i) is acc [rows, nb] with k32 block i chained in (numpy,
    vectorized over the outputs: slot_chain's order is built from it)."""
    op = _operands(raw, t, qx, dx, S)
    I, dx = op["I"], op["dx"]
    rows, nb = I.shape[:2]
    if t == Q.Q6_K:
        sc, d = op["sc"], op["d"]

        def step(acc, i):
            J = sc[:, 2 * i, None] * I[:, :, 2 * i] + sc[:, 2 * i + 1, None] * I[:, :, 2 * i + 1]
            return fma32((J * d[:, i, None].astype(np.float64)).astype(np.float32), dx[None, :, i], acc)
        return step, rows, nb, dx.shape[1]
    scale, ndmm, sx = op["scale"], op["ndmm"], op["sx"]

    def step(acc, i):
        p = (I[:, :, i] * scale[:, i, None].astype(np.float64)).astype(np.float32)
        acc = fma32(p, dx[None, :, i], acc)
        return acc if not ndmm.size else fma32(ndmm[:, i, None], sx[None, :, i], acc)
    return step, rows, nb, dx.shape[1]


def chain(raw: np.ndarray, t: int, qx: np.ndarray, dx: np.ndarray, S: np.ndarray) -> np.ndarray:
    """y [nb, rows] float32: the chain of GGUF rows `raw` (uint8 [rows, row bytes]) of type t
    against q8 activations qx (int8 [nb, K]), dx (float32 [nb, K / 32]) and S (int [nb, K / 32]).
    _block_step's operations, compiled (numba): each output's blocks in a loop with a scalar fma32."""
    op = _operands(raw, t, qx, dx, S)
    if t == Q.Q6_K:
        return _chain_q6k(op["I"], op["sc"], op["d"], op["dx"]).T
    return _chain_blocks(op["I"], op["scale"], op["dx"], op["ndmm"], op["sx"]).T


@njit(cache=True)
def _fma32s(a, b, c):
    """fma32 on float32 scalars (the same algorithm: an exact product, TwoSum, the double
    rounding's midpoint resolved by the error's sign)."""
    ab = np.float64(a) * np.float64(b)
    cd = np.float64(c)
    s = ab + cd
    bb = s - ab
    e = (ab - (s - bb)) + (cd - bb)
    r = np.float32(s)
    rd = np.float64(r)
    if rd == s or e == 0:
        return r
    nbr = np.nextafter(r, np.float32(np.inf) if s > rd else np.float32(-np.inf))
    if (rd + np.float64(nbr)) * 0.5 != s:
        return r
    lo, hi = (r, nbr) if r < nbr else (nbr, r)
    return hi if e > 0 else lo


@njit(cache=True, parallel=True)
def _chain_blocks(I, scale, dx, ndmm, sx):
    """Q4_0 / Q8_0 / Q4_K: acc [rows, nb] over blocks i: p = fl(I d'), acc = fma(p, dx, acc) (and
    acc = fma(ndmm, sx, acc) when ndmm has rows)."""
    rows, nb, nblk = I.shape
    mins = ndmm.shape[0] > 0
    acc = np.zeros((rows, nb), np.float32)
    for r in prange(rows):
        for b in range(nb):
            a = np.float32(0.0)
            for i in range(nblk):
                p = np.float32(I[r, b, i] * np.float64(scale[r, i]))
                a = _fma32s(p, dx[b, i], a)
                if mins:
                    a = _fma32s(ndmm[r, i], sx[b, i], a)
            acc[r, b] = a
    return acc


@njit(cache=True, parallel=True)
def _chain_q6k(I16, sc, d, dx):
    """Q6_K: acc [rows, nb] over blocks i: J = sc_2i I_2i + sc_2i+1 I_2i+1 (exact), p = fl(J d),
    acc = fma(p, dx, acc)."""
    rows, nb, n16 = I16.shape
    acc = np.zeros((rows, nb), np.float32)
    for r in prange(rows):
        for b in range(nb):
            a = np.float32(0.0)
            for i in range(n16 // 2):
                J = sc[r, 2 * i] * I16[r, b, 2 * i] + sc[r, 2 * i + 1] * I16[r, b, 2 * i + 1]
                p = np.float32(J * np.float64(d[r, i]))
                a = _fma32s(p, dx[b, i], a)
            acc[r, b] = a
    return acc


SLOTS = 32


def slot_chain(raw: np.ndarray, t: int, qx: np.ndarray, dx: np.ndarray, S: np.ndarray) -> np.ndarray:
    """y [nb, rows] float32 in the slot order: unit u (64 weights: k32 blocks 2u, 2u + 1) belongs to
    slot u % 32 (a decode matvec lane's units); slot l's value is the chain (above) over its units'
    blocks in increasing k from +0; the output is the left fold of the 32 slot values,
    ((s_0 + s_1) + s_2) + ... + s_31, each add one rounding (empty slots are +0)."""
    step, rows, nb, nblk = _block_step(raw, t, qx, dx, S)
    if nblk % 2:
        raise MemraError(f"slot_chain: K = {32 * nblk} is not a multiple of the 64-weight unit")
    tot = None
    for l in range(SLOTS):
        acc = np.zeros((rows, nb), np.float32)
        for u in range(l, nblk // 2, SLOTS):
            acc = step(step(acc, 2 * u), 2 * u + 1)
        tot = acc if tot is None else (tot + acc).astype(np.float32)   # float32 add: one rounding
    return tot.T


def chain_out(raw: np.ndarray, t: int, qx: np.ndarray, dx: np.ndarray, S: np.ndarray, *, act=None,
              residual: np.ndarray | None = None) -> np.ndarray:
    """The kernel's outputs [nb, N]: the chain, or with act (a float32 function of the gate's
    values, the device's own, e.g. act_mul run on the chain) fl(act(gate) * up) for a [gate; up]
    weight (2N rows), then fl(v + residual)."""
    y = chain(raw, t, qx, dx, S)
    if act is not None:
        n = y.shape[1] // 2
        y = (np.asarray(act(y[:, :n], y[:, n:]), np.float32))
    if residual is not None:
        y = (y + np.asarray(residual, np.float32)).astype(np.float32)   # numpy float32 add: one rounding
    return y
