#!/usr/bin/env python3
"""chain_ref.py — the exact-order CPU reference of chain_mv.cu and a numpy replay of its index maps.

    python3 experiments/chain_mv/chain_ref.py        # fma32 self-test, chain reference, kernel replay

- fma32(a, b, c): float32 fma (a b + c rounded once, to nearest even), vectorized and exact: a b of
  two float32 is exact in float64 (48 significant bits); s = fl64(ab + c) and its error e (TwoSum:
  s + e = ab + c exactly); rounding s to float32 is the right answer unless s lies exactly on a
  float32 rounding midpoint (a 25-bit value, so a double) with e != 0, where e's sign picks the side.
  (A midpoint m != s is >= 1 double ulp from s and |e| <= half an ulp, so s + e never crosses one.)
  Checked against exact rational arithmetic (fractions) on random and constructed cases.
- chain_ref(raw, q, xs): y[b, n] of the chain, bit for bit what chain_mv.cu must produce:
  I_i from the GGUF rows (memra.model.quants' Q4_K decode: q per element, d sc and -(dmin m) per
  sub-block) in integers, p = fl(I dsc), acc = fma(p, dx, acc), acc = fma(ndmm, sx, acc), i increasing.
- replay(raw, q, xs, defs): chain_mv.cu's data flow transcribed: the planes (pack_planes), the loader
  lanes' byte offsets into bulk / meta / xq / xs, qtypes.cuh's idots nibble pattern and
  rowscal_k4 byte selection, the float4 stores into the flat P / X shared arrays (stride CM_PS), the
  barrier / double-buffer schedule, and the chain warp's reads; compared bit for bit with chain_ref.
- replay_v2(raw, q, xs, defs, nb, grid): the CM_V2 kernel (persistent (group, tile) stream, the
  CM_PF + 1 slot weight ring with step tags, CM_GLU row maps and epilogues); bit for bit with chain_ref.
"""
from __future__ import annotations

import sys
import time
from fractions import Fraction
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT))
Q4_K = 12


# ---------------------------------------------------------------------------------------
# exact float32 fma

def fma32(a, b, c) -> np.ndarray:
    """Correctly rounded float32 fma(a, b, c), elementwise (float32 arrays or scalars)."""
    a, b, c = (np.asarray(v, np.float32).astype(np.float64) for v in (a, b, c))
    ab = a * b                                   # exact
    s = ab + c
    bb = s - ab                                  # TwoSum (Knuth): s + e == ab + c exactly
    e = (ab - (s - bb)) + (c - bb)
    r = s.astype(np.float32)
    rd = r.astype(np.float64)
    # the float32 neighbour of r on s's side, and whether s is the midpoint of r and it
    toward = np.where(s > rd, np.inf, -np.inf).astype(np.float32)
    nb = np.nextafter(r, toward)
    mid = (rd != s) & ((rd + nb.astype(np.float64)) * 0.5 == s) & (e != 0)
    # at a midpoint the exact value lies on e's side: the larger neighbour if e > 0
    lo, hi = np.minimum(r, nb), np.maximum(r, nb)
    out = np.where(mid, np.where(e > 0, hi, lo), r)
    return out.astype(np.float32)


def _round32_exact(v: Fraction, sign_zero: bool) -> np.float32:
    """Fraction -> float32, round to nearest even, exactly (normal and subnormal range)."""
    if v == 0:
        return np.float32(-0.0) if sign_zero else np.float32(0.0)
    neg = v < 0
    v = -v if neg else v
    e = v.numerator.bit_length() - v.denominator.bit_length()
    if Fraction(2) ** e > v:
        e -= 1
    e = max(e, -126)                       # subnormals: a fixed quantum 2^-149
    q = Fraction(2) ** (e - 23)            # the ulp at v
    m = v / q
    n = m.numerator // m.denominator
    rem = m - n
    if rem > Fraction(1, 2) or (rem == Fraction(1, 2) and n % 2 == 1):
        n += 1
    r = np.float32(float(n * q))           # n * q is a float32 (or 2^128 -> inf): exact in float()
    return -r if neg else r


def fma32_exact(a: np.float32, b: np.float32, c: np.float32) -> np.float32:
    """Scalar reference by rationals (IEEE sign of an exact zero: -0 only if a b and c are both -0)."""
    a, b, c = np.float32(a), np.float32(b), np.float32(c)
    v = Fraction(float(a)) * Fraction(float(b)) + Fraction(float(c))
    ab_neg0 = (float(a) * float(b) == 0) and (np.signbit(a) != np.signbit(b))
    return _round32_exact(v, ab_neg0 and float(c) == 0 and np.signbit(c))


def fma_selftest(rng) -> int:
    bad = 0

    def same(x, y):
        return np.asarray(x, np.float32).view(np.uint32) == np.asarray(y, np.float32).view(np.uint32)

    # 1. random cases of mixed magnitudes, and near-cancellations, against rationals
    n = 4000
    a = (rng.standard_normal(n) * 2.0 ** rng.integers(-20, 20, n)).astype(np.float32)
    b = (rng.standard_normal(n) * 2.0 ** rng.integers(-20, 20, n)).astype(np.float32)
    c = (rng.standard_normal(n) * 2.0 ** rng.integers(-40, 40, n)).astype(np.float32)
    c[: n // 4] = (-(a[: n // 4].astype(np.float64) * b[: n // 4]) * (1 + rng.standard_normal(n // 4) * 2.0 ** -20)).astype(np.float32)
    got = fma32(a, b, c)
    ref = np.array([fma32_exact(x, y, z) for x, y, z in zip(a, b, c)], np.float32)
    k = int((~same(got, ref)).sum())
    bad += k > 0
    print(f"{'PASS' if not k else 'FAIL'}  fma32 vs rationals: {n} random / near-cancelling cases, {k} differ", flush=True)
    # 2. c = 0: fma(a, b, 0) = fl(a b), numpy's float32 product (one rounding, no double rounding)
    got = fma32(a, b, np.zeros(n, np.float32))
    k = int((~same(got, a * b)).sum())
    bad += k > 0
    print(f"{'PASS' if not k else 'FAIL'}  fma32(a, b, 0) vs numpy float32 a*b: {k} of {n} differ", flush=True)
    # 3. b = 1: fma(a, 1, c) = fl(a + c), numpy's float32 sum
    got = fma32(a, np.ones(n, np.float32), c)
    k = int((~same(got, a + c)).sum())
    bad += k > 0
    print(f"{'PASS' if not k else 'FAIL'}  fma32(a, 1, c) vs numpy float32 a+c: {k} of {n} differ", flush=True)
    # 4. constructed double-rounding traps: a b exactly a float32 midpoint, c a tiny push below the
    # double's precision (fl64(ab + c) = the midpoint; the exact value is past it), both signs;
    # ties to even; signed zeros; a subnormal result
    t = 2.0 ** -12
    cases = [
        (1 + t, 1 + t, 2.0 ** -80, np.float32(1 + 2 * t + 2.0 ** -23)),     # 1 + 2^-11 + 2^-24 + tiny: up
        (1 + t, 1 + t, -2.0 ** -80, np.float32(1 + 2 * t)),                  # ... - tiny: down
        (1 + t, 1 + t, 0.0, np.float32(1 + 2 * t)),                          # the tie: to even (down)
        (1 + 3 * t, 1 + t, 0.0, None),                                       # a tie on the odd side
        (-(1 + t), 1 + t, -2.0 ** -80, -np.float32(1 + 2 * t + 2.0 ** -23)),
        (1.0, 1.0, -1.0, np.float32(0.0)),                                   # exact zero: +0
        (-0.0, 1.0, -0.0, np.float32(-0.0)),                                 # -0 + -0 = -0
        (0.0, -1.0, 0.0, np.float32(0.0)),                                   # -0 + +0 = +0
        (2.0 ** -70, 2.0 ** -70, 2.0 ** -149, None),                         # subnormal region
        (2.0 ** -75, 2.0 ** -75 * 3, 0.0, None),                             # a subnormal product
        (float(np.float32(1 / 3)), 3.0, -1.0, None),                         # the classic fma residual
    ]
    k = 0
    for a_, b_, c_, want in cases:
        x, y, z = np.float32(a_), np.float32(b_), np.float32(c_)
        g = fma32(x, y, z)
        r = fma32_exact(x, y, z)
        ok = same(g, r) and (want is None or same(g, want))
        k += not ok
        if not ok:
            print(f"   fma32({x!r}, {y!r}, {z!r}) = {g!r}, exact {r!r}, expected {want!r}")
    bad += k > 0
    print(f"{'PASS' if not k else 'FAIL'}  fma32 constructed cases (double-rounding traps, ties, signed zeros, subnormals): "
          f"{len(cases) - k} / {len(cases)}", flush=True)
    # 5. the naive fl32(fl64(ab + c)) is wrong on case 1 (so the trap is real)
    x = np.float32(1 + t)
    naive = np.float32(np.float64(x) * np.float64(x) + 2.0 ** -80)
    trap = not same(naive, fma32(x, x, np.float32(2.0 ** -80)))
    bad += not trap
    print(f"{'PASS' if trap else 'FAIL'}  the naive double-then-float rounding differs on the trap (it is a real trap)", flush=True)
    return bad


# ---------------------------------------------------------------------------------------
# the chain reference

def decode_q4k(raw: np.ndarray):
    """GGUF Q4_K rows [rows, K/256*144] -> (q [rows, K] int64 0..15, dsc, ndmm [rows, K/32] float32)
    via memra.model.quants (ggml's dequantize_row_q4_K fields)."""
    from memra.model.quants import _q4_k
    rows = raw.shape[0]
    nsb = raw.shape[1] // 144
    q, dsc, ndmm = _q4_k(np.ascontiguousarray(raw).reshape(rows * nsb, 144))
    return (q.reshape(rows, nsb * 256).astype(np.int64), dsc.astype(np.float32).reshape(rows, nsb * 8),
            ndmm.astype(np.float32).reshape(rows, nsb * 8))


def chain_ref(raw: np.ndarray, xq: np.ndarray, xs: np.ndarray) -> np.ndarray:
    """y [nb, rows] float32: every output the chain over its k32 blocks, i increasing."""
    q, dsc, ndmm = decode_q4k(raw)
    rows, K = q.shape
    nb = xq.shape[0]
    nblk = K // 32
    I = np.einsum("rik,bik->bri", q.reshape(rows, nblk, 32), xq.reshape(nb, nblk, 32).astype(np.int64))
    assert np.all(np.abs(I) < 2 ** 24)
    p = I.astype(np.float32) * dsc[None]                               # fl(I dsc), float32
    dx = xs["d"].astype(np.float32).reshape(nb, nblk)
    sx = dx * xs["s"].astype(np.float32).reshape(nb, nblk)             # fl(dx S)
    acc = np.zeros((nb, rows), np.float32)
    for i in range(nblk):
        acc = fma32(p[:, :, i], dx[:, i:i + 1], acc)
        acc = fma32(np.broadcast_to(ndmm[None, :, i], acc.shape), sx[:, i:i + 1], acc)
    return acc


# ---------------------------------------------------------------------------------------
# replay of chain_mv.cu's maps

TU, TB = 32, 64
PS = 2 * TB + 4


def kdefs(defs: dict) -> tuple[int, int, int, int]:
    """(CM_NW, CM_B, CM_CR, CM_RPW) of a configuration, as chain_mv.cu derives them."""
    nw, b = int(defs.get("CM_NW", 8)), int(defs.get("CM_B", 1))
    cr = int(defs.get("CM_CR", 32 // b))
    return nw, b, cr, -(-cr // nw)


def _byte_of(m: np.ndarray, k: np.ndarray) -> np.ndarray:
    """qtypes.cuh byte_of: byte k (per lane) of the lanes' 16 meta bytes m [lanes, 16]."""
    return m[np.arange(m.shape[0]), k].astype(np.int64)


def _scale_min_k4(m: np.ndarray, j: np.ndarray):
    lo = j < 4
    sc_lo, mn_lo = _byte_of(m, np.where(lo, 4 + j, 4)) & 63, _byte_of(m, np.where(lo, 8 + j, 8)) & 63
    jj = np.where(lo, 4, j)
    a, l_, h_ = _byte_of(m, 8 + jj), _byte_of(m, jj), _byte_of(m, 4 + jj)
    sc_hi, mn_hi = (a & 0xF) | ((l_ >> 6) << 4), (a >> 4) | ((h_ >> 6) << 4)
    return np.where(lo, sc_lo, sc_hi), np.where(lo, mn_lo, mn_hi)


def _f16(m: np.ndarray, off: int) -> np.ndarray:
    return m[:, off:off + 2].copy().view("<f2").reshape(-1).astype(np.float32)


def _magic(v) -> np.ndarray:
    """bits 0x4B000000 | v (v < 2^23) as float32."""
    return (np.asarray(v, np.int64) | 0x4B000000).astype(np.uint32).view(np.float32)


def _fast_unit(mm: np.ndarray, lanes: np.ndarray, i0, i1, d, dmin):
    """chain_mv.cu's CM_FAST fast_rowscal + fast_unit, transcribed (word / byte ops, magic FFMAs)."""
    w = mm.copy().view("<u4").astype(np.int64)          # 4 words a lane
    sh = (lanes & 1) << 4
    hij = (lanes & 2) != 0
    lo, hi, a = (w[:, 1] >> sh) & 0xFFFF, (w[:, 2] >> sh) & 0xFFFF, (w[:, 3] >> sh) & 0xFFFF
    sc = np.where(hij, (a & 0x0F0F) | ((lo >> 2) & 0x3030), lo & 0x3F3F)
    mn = np.where(hij, ((a >> 4) & 0x0F0F) | ((hi >> 2) & 0x3030), hi & 0x3F3F)
    f32 = np.float32
    d16 = d * f32(0.0625)
    dsc0 = fma32(_magic(sc & 0xFF), d, f32(-8388608.0) * d)
    dsc1h = fma32(_magic(sc >> 8), d16, f32(-8388608.0) * d16)
    n0 = fma32(_magic(mn & 0xFF), -dmin, f32(8388608.0) * dmin)
    n1 = fma32(_magic(mn >> 8), -dmin, f32(8388608.0) * dmin)
    mb0, mb1h = f32(-12582912.0) * dsc0, f32(-12582912.0) * dsc1h
    # the dp4a accumulators from 0x4B400000: low nibbles I0; high nibbles in place (bytes & 0xF0) 16 I1
    j0 = (0x4B400000 + i0).astype(np.uint32).view(np.float32)
    j1 = (0x4B400000 + 16 * i1).astype(np.uint32).view(np.float32)
    return fma32(j0, dsc0, mb0), n0, fma32(j1, dsc1h, mb1h), n1


def replay(raw: np.ndarray, xq: np.ndarray, xs: np.ndarray, defs: dict, nb: int | None = None) -> np.ndarray:
    """y [nb, N] (NaN where nothing was stored) as chain_mv.cu computes it, launch by launch."""
    from memra.gpu.ops.matvec import pack_planes
    NW, B, CR, RPW = kdefs(defs)
    fast = int(defs.get("CM_FAST", 1))
    N, K = raw.shape[0], raw.shape[1] // 144 * 256
    nb = xq.shape[0] if nb is None else nb
    assert nb <= B
    bulk, meta = pack_planes(raw, Q4_K)
    bflat, mflat = bulk.reshape(-1), meta.reshape(-1)
    xqf, xsf = xq.reshape(-1), xs.reshape(-1)
    nu, nt = K >> 6, -(-(K >> 6) // TU)
    brs, mrs = nu * 32, (K >> 8) * 16
    y = np.full(nb * N, np.nan, np.float32)
    lanes = np.arange(32)
    for bx in range(-(-N // CR)):
        row0 = bx * CR
        sP = np.full((2, CR * B * PS), np.nan, np.float32)
        sX = np.full((2, B * PS), np.nan, np.float32)
        acc = np.zeros(32, np.float32)                       # the chain warp's lanes
        c = np.minimum(lanes, CR * B - 1)
        for t in range(nt):
            # loaders of tile t (the registers: tile t's weights, loaded in the previous iteration)
            u = TU * t + lanes
            valid = u < nu
            ul = np.minimum(u, nu - 1)
            for warp in range(NW):
                for r in range(RPW):
                    rr = warp + NW * r
                    row = min(row0 + min(rr, CR - 1), N - 1)
                    qb = np.stack([bflat[row * brs + 32 * ul + o] for o in range(32)], 1).astype(np.int64)   # 2 x 16 B
                    mm = np.stack([mflat[row * mrs + 16 * (ul >> 2) + o] for o in range(16)], 1)          # 16 B meta
                    j = ul & 3
                    sc0, m0 = _scale_min_k4(mm, 2 * j)
                    sc1, m1 = _scale_min_k4(mm, 2 * j + 1)
                    d, dmin = _f16(mm, 0), _f16(mm, 2)
                    for b in range(B):
                        if b >= nb:
                            continue
                        xv = np.stack([xqf[b * K + 64 * ul + o] for o in range(64)], 1).astype(np.int64)
                        sc = np.stack([xsf[b * (K >> 5) + 2 * ul + o] for o in range(2)], 1)
                        if warp == 0:
                            d0, d1 = sc["d"][:, 0].astype(np.float32), sc["d"][:, 1].astype(np.float32)
                            for ln in np.nonzero(valid)[0]:
                                o = b * PS + 4 * ln
                                sX[t & 1, o:o + 4] = (d0[ln], d0[ln] * np.float32(sc["s"][ln, 0]),
                                                      d1[ln], d1[ln] * np.float32(sc["s"][ln, 1]))
                        if rr >= CR:
                            continue
                        # TQ4_K::idots: low nibbles of qs[0:16] x x[0:16] + of qs[16:32] x x[16:32] -> ints[0];
                        # high nibbles x x[32:48], x[48:64] -> ints[1]
                        i0 = ((qb & 15) * xv[:, 0:32]).sum(1)
                        i1 = ((qb >> 4) * xv[:, 32:64]).sum(1)
                        if fast:
                            p0, n0, p1, n1 = _fast_unit(mm, lanes, i0, i1, d, dmin)
                        else:
                            dsc0, dsc1 = d * sc0.astype(np.float32), d * sc1.astype(np.float32)
                            p0, p1 = i0.astype(np.float32) * dsc0, i1.astype(np.float32) * dsc1
                            n0, n1 = -(dmin * m0.astype(np.float32)), -(dmin * m1.astype(np.float32))
                        for ln in np.nonzero(valid)[0]:
                            o = (rr * B + b) * PS + 4 * ln
                            sP[t & 1, o:o + 4] = (p0[ln], n0[ln], p1[ln], n1[ln])
            # barrier t; the chain warp: tile t from buffer t % 2 (the loaders' tile t + 1 goes to the other)
            nbk = 2 * min(TU, nu - TU * t)
            P = sP[t & 1].reshape(-1)
            X = sX[t & 1].reshape(-1)
            for i in range(0, nbk, 2):
                pv = np.stack([P[c * PS + 2 * i + o] for o in range(4)], 1)
                xv4 = np.stack([X[(c % B) * PS + 2 * i + o] for o in range(4)], 1)
                for o in range(4):
                    acc = fma32(pv[:, o], xv4[:, o], acc)
            # buffer t % 2 is rewritten at t + 2 (after barrier t + 1): poison it as the kernel might
            sP[t & 1] = np.nan
            sX[t & 1] = np.nan
        for ln in range(32):
            row, b = row0 + ln // B, ln % B
            if ln < CR * B and row < N and b < nb:
                y[b * N + row] = acc[ln]
    return y.reshape(nb, N)


def replay_v2(raw: np.ndarray, xq: np.ndarray, xs: np.ndarray, defs: dict, nb: int | None = None,
              grid: int | None = None, _mut: str = "") -> np.ndarray:
    """chain_mv.cu's CM_V2 kernel transcribed, block by block: the grid-strided (group, tile) stream
    s = 0 .. ns - 1 of each block (group gi s / nt of the block = group blockIdx + gi gridDim), v2_row's
    weight rows (CM_GLU: block row rr < CR/2 the gate row o, else the up row o + N), the CM_PF + 1 slot
    weight ring (registers or the cp.async stages: one model, since each lane reads back only its own
    slot): written for step s + PF during step s (steps 0 .. PF - 1 in the prologue), read at step s
    from slot s % NBUF, each slot tagged with its step (a read of a wrong / stale slot raises) and
    poisoned after the read; the P / X double buffer by s & 1 (poisoned after the chain warp's tile),
    the chain reset at t = 0, the store at t = nt - 1 (CM_GLU 1: silu(gate) up from the lane
    CR/2 B above, float32 numpy; CM_GLU 2: both raw chains, y [nb, 2N]).
    raw: the weight rows (CM_GLU: 2N rows). Returns y [nb, N] (CM_GLU 2: [nb, 2N]); NaN where unstored."""
    from memra.gpu.ops.matvec import pack_planes
    NW, B, CR, RPW = kdefs(defs)
    PF = int(defs.get("CM_PF", 1))
    NBUF = PF + 1
    glu = int(defs.get("CM_GLU", 0))
    NCW, XS = int(defs.get("CM_NCW", 1)), int(defs.get("CM_XS", 0))
    NL = 32 * NCW                                   # chain lanes (CM_NCW chain warps)
    CRO = CR // 2 if glu else CR
    NWR, K = raw.shape[0], raw.shape[1] // 144 * 256
    N = NWR // 2 if glu else NWR
    nb = xq.shape[0] if nb is None else nb
    assert nb <= B
    bulk, meta = pack_planes(raw, Q4_K)
    bflat, mflat = bulk.reshape(-1), meta.reshape(-1)
    xqf, xsf = xq.reshape(-1), xs.reshape(-1)
    nu, nt = K >> 6, -(-(K >> 6) // TU)
    brs, mrs = nu * 32, (K >> 8) * 16
    ng = -(-N // CRO)
    G = grid if grid is not None else ng
    y = np.full(nb * (2 * N if glu == 2 else N), np.nan, np.float32)
    lanes = np.arange(32)
    hij = (lanes & 2) != 0

    def v2_row(g, rr):
        if glu:
            o = min(g * CRO + rr % CRO, N - 1)
            return o + N if rr % CR >= CRO else o
        return min(g * CRO + min(rr, CR - 1), N - 1)

    for bx in range(G):
        ngb = (ng - 1 - bx) // G + 1 if bx < ng else 0
        ns = ngb * nt
        ring = [dict() for _ in range(NBUF)]        # slot -> {"step": s, (warp, r): (qs [32, 32], meta [32, 16])}

        def load(slot, s):
            if s >= ns:
                return
            gi, t = divmod(s, nt)
            g = bx + gi * G
            u = np.minimum(TU * t + lanes, nu - 1)
            ring[slot].clear()
            ring[slot]["step"] = s
            for warp in range(NW):
                for r in range(RPW):
                    row = v2_row(g, warp + NW * r)
                    qb = np.stack([bflat[row * brs + 32 * u + o] for o in range(32)], 1).astype(np.int64)
                    mm = np.stack([mflat[row * mrs + 16 * (u >> 2) + o] for o in range(16)], 1)
                    ring[slot][(warp, r)] = (qb, mm)

        xtag = [0, None]                             # CM_XS: the step whose x tile each buffer holds
        for k in range(PF):
            load(k, k)
        sP = np.full((2, CR * B * PS), np.nan, np.float32)
        sX = np.full((2, B * PS), np.nan, np.float32)
        acc = np.zeros(NL, np.float32)
        c = np.minimum(np.arange(NL), CR * B - 1)
        for s in range(ns):
            k = s % NBUF
            if XS:
                xtag[(s + 1) & 1] = s + 1 if s + 1 < ns else None   # xload(s + 1): the other buffer
                if xtag[s & 1] != s:
                    raise AssertionError(f"block {bx} step {s}: x buffer {s & 1} holds step {xtag[s & 1]}")
            load((k + PF) % NBUF, s + PF)
            if _mut == "ring":
                k = (k + 1) % NBUF
            if ring[k].get("step") != s:
                raise AssertionError(f"block {bx} step {s}: ring slot {k} holds step {ring[k].get('step')}")
            gi, t = divmod(s, nt)
            g = bx + gi * G
            u = TU * t + lanes
            valid = u < nu
            ul = np.minimum(u, nu - 1)
            for warp in range(NW):
                for r in range(RPW):
                    rr = warp + NW * r
                    qb, mm = ring[k][(warp, r)]
                    d, dmin = _f16(mm, 0), _f16(mm, 2)
                    for b in range(B):
                        if b >= nb:
                            continue
                        xv = np.stack([xqf[b * K + 64 * ul + o] for o in range(64)], 1).astype(np.int64)
                        sc = np.stack([xsf[b * (K >> 5) + 2 * ul + o] for o in range(2)], 1)
                        if warp == 0 and r == 0:
                            d0, d1 = sc["d"][:, 0].astype(np.float32), sc["d"][:, 1].astype(np.float32)
                            for ln in np.nonzero(valid)[0]:
                                o = b * PS + 4 * ln
                                sX[s & 1, o:o + 4] = (d0[ln], d0[ln] * np.float32(sc["s"][ln, 0]),
                                                      d1[ln], d1[ln] * np.float32(sc["s"][ln, 1]))
                        if rr >= CR:
                            continue
                        i0 = ((qb & 15) * xv[:, 0:32]).sum(1)
                        i1 = ((qb >> 4) * xv[:, 32:64]).sum(1)
                        p0, n0, p1, n1 = _fast_unit(mm, lanes, i0, i1, d, dmin)
                        for ln in np.nonzero(valid)[0]:
                            o = (rr * B + b) * PS + 4 * ln
                            sP[s & 1, o:o + 4] = (p0[ln], n0[ln], p1[ln], n1[ln])
            ring[k] = {"step": None}                 # consumed: a later read of it without a refill raises
            # barrier s; the chain warp: tile t of group g from buffer s % 2
            if t == 0 and _mut != "noreset":
                acc = np.zeros(NL, np.float32)
            nbk = 2 * min(TU, nu - TU * t)
            P, X = sP[s & 1], sX[s & 1]
            for i in range(0, nbk, 2):
                pv = np.stack([P[c * PS + 2 * i + o] for o in range(4)], 1)
                xv4 = np.stack([X[(c % B) * PS + 2 * i + o] for o in range(4)], 1)
                for o in range(4):
                    acc = fma32(pv[:, o], xv4[:, o], acc)
            sP[s & 1] = np.nan
            sX[s & 1] = np.nan
            if t == nt - 1:
                for ln in range(NL):
                    rr, b = ln // B, ln % B
                    if glu == 1:
                        o = g * CRO + rr
                        if ln < CRO * B and o < N and b < nb:
                            gt, up = acc[ln], acc[ln + CRO * B]
                            with np.errstate(over="ignore"):
                                y[b * N + o] = np.float32(gt / (np.float32(1) + np.exp(-gt)) * up)
                    elif glu == 2:
                        o = g * CRO + rr % CRO
                        if ln < CR * B and o < N and b < nb:
                            y[b * 2 * N + (N if rr >= CRO else 0) + o] = acc[ln]
                    else:
                        o = g * CRO + rr
                        if ln < CR * B and o < N and b < nb:
                            y[b * N + o] = acc[ln]
    return y.reshape(nb, -1)


def replay_v2_selftest(rng) -> int:
    """replay_v2 vs chain_ref: plain / persistent grids (several groups a block, a group boundary
    inside the prefetch window), CM_PF 1 / 2, partial row groups and K tiles, batch, glu 2 (bit-exact)
    and glu 1 (float32 silu of the bit-exact chains)."""
    from memra.gpu.ops import matvec as MV
    from memra.gpu.q8 import quantize_q8_ref
    bad = 0
    V2 = {"CM_V2": 1}
    cases = ((37, 2048 + 768, 1, {**V2, "CM_NW": 8, "CM_CR": 16, "CM_MINB": 2}, None),
             (37, 2048 + 768, 1, {**V2, "CM_NW": 8, "CM_CR": 16, "CM_PF": 2, "CM_ASYNC": 1}, 2),
             (41, 1024, 1, {**V2, "CM_NW": 8, "CM_CR": 8, "CM_PF": 2, "CM_ASYNC": 1}, 3),
             (40, 4096 + 256, 1, {**V2, "CM_NW": 8, "CM_CR": 32}, 1),
             (11, 1280, 7, {**V2, "CM_NW": 4, "CM_B": 8, "CM_CR": 4, "CM_PF": 2, "CM_ASYNC": 1}, 2),
             (13, 2304, 8, {**V2, "CM_NW": 8, "CM_B": 8, "CM_CR": 8, "CM_NCW": 2, "CM_PF": 2, "CM_ASYNC": 1, "CM_XS": 1}, 1),
             (9, 1280, 5, {**V2, "CM_NW": 4, "CM_B": 8, "CM_CR": 4, "CM_PF": 2, "CM_ASYNC": 1, "CM_XS": 1}, None),
             (2 * 19, 2304, 1, {**V2, "CM_NW": 8, "CM_CR": 16, "CM_PF": 2, "CM_ASYNC": 1, "CM_GLU": 2}, 2),
             (2 * 19, 2304, 1, {**V2, "CM_NW": 8, "CM_CR": 16, "CM_PF": 2, "CM_ASYNC": 1, "CM_GLU": 1}, 2))
    for (NR, K, nb, defs, grid) in cases:
        raw = MV.random_weight(Q4_K, NR, K, rng)
        x = (rng.standard_normal((nb, K)) * rng.uniform(0.5, 4)).astype(np.float32)
        x[0, :32] = 0.0
        q, s = quantize_q8_ref(x)
        ref = chain_ref(raw, q, s)
        got = replay_v2(raw, q, s, defs, nb, grid)
        glu = int(defs.get("CM_GLU", 0))
        if glu == 1:
            h = NR // 2
            with np.errstate(over="ignore"):
                gt = ref[:, :h]
                want = (gt / (np.float32(1) + np.exp(-gt)) * ref[:, h:]).astype(np.float32)
            same = np.array_equal(got.view(np.uint32), want.view(np.uint32))
        else:
            same = np.array_equal(got.view(np.uint32), ref.view(np.uint32))
        bad += not same
        print(f"{'PASS' if same else 'FAIL'}  replay_v2 of chain_mv {defs} rows={NR} K={K} nb={nb} grid={grid}: "
              f"bit-equal to chain_ref{' (glu 1: its float32 silu(gate) up)' if glu == 1 else ''} ({'yes' if same else 'NO'})",
              flush=True)
    # mutations: the chain not reset at a group boundary (acc carried on) must change bits; the ring
    # read one slot off must be caught by the slot tags
    N, K = 24, 1024
    raw = MV.random_weight(Q4_K, N, K, rng)
    q, s = quantize_q8_ref(rng.standard_normal((1, K)).astype(np.float32))
    ref = chain_ref(raw, q, s)
    d8 = {**V2, "CM_NW": 8, "CM_CR": 8, "CM_PF": 2}
    got = replay_v2(raw, q, s, d8, 1, 1)
    ok = np.array_equal(got.view(np.uint32), ref.view(np.uint32))
    mut = replay_v2(raw, q, s, d8, 1, 1, _mut="noreset")
    caught = not np.array_equal(mut.view(np.uint32), ref.view(np.uint32))
    try:
        replay_v2(raw, q, s, d8, 1, 1, _mut="ring")
        caught_ring = False
    except AssertionError:
        caught_ring = True
    bad += not (ok and caught and caught_ring)
    print(f"{'PASS' if ok and caught and caught_ring else 'FAIL'}  replay_v2 on a 1-block grid (3 groups in one stream): "
          f"bit-equal ({'yes' if ok else 'NO'}); mutations caught: no chain reset at a group boundary "
          f"({'yes' if caught else 'NO'}), ring slot off by one ({'yes' if caught_ring else 'NO'})", flush=True)
    return bad


def replay_selftest(rng) -> int:
    from memra.gpu.ops import matvec as MV
    from memra.gpu.q8 import quantize_q8_ref
    bad = 0
    for (N, K, nb, defs) in ((40, 2048 + 768, 1, {"CM_NW": 8}), (40, 2048 + 768, 1, {"CM_NW": 8, "CM_FAST": 0}), (33, 4096, 1, {"CM_NW": 16}),
                             (17, 1024, 1, {"CM_NW": 16, "CM_CR": 16}), (10, 2304, 3, {"CM_NW": 8, "CM_B": 4}),
                             (9, 1280, 8, {"CM_NW": 4, "CM_B": 8})):
        raw = MV.random_weight(Q4_K, N, K, rng)
        x = (rng.standard_normal((nb, K)) * rng.uniform(0.5, 4)).astype(np.float32)
        x[0, :32] = 0.0
        q, s = quantize_q8_ref(x)
        ref = chain_ref(raw, q, s)
        got = replay(raw, q, s, defs, nb)
        same = np.array_equal(got.view(np.uint32), ref.view(np.uint32))
        # float64 sanity
        wf = MV.dequant_rows(raw, Q4_K).astype(np.float64)
        xv = (q.reshape(nb, -1, 32).astype(np.float64) * s["d"][..., None]).reshape(nb, K)
        r64 = xv @ wf.T
        err = np.linalg.norm(ref - r64) / np.linalg.norm(r64)
        ok = same and err < 1e-5
        bad += not ok
        print(f"{'PASS' if ok else 'FAIL'}  replay of chain_mv {defs} N={N} K={K} nb={nb}: bit-equal to chain_ref "
              f"({'yes' if same else 'NO'}), chain_ref vs float64 rel err {err:.1e}", flush=True)
    # a mutation: the replay with the row scalars of the wrong sub-block pair must differ (the check bites)
    N, K = 8, 512
    raw = MV.random_weight(Q4_K, N, K, rng)
    q, s = quantize_q8_ref(rng.standard_normal((1, K)).astype(np.float32))
    ref = chain_ref(raw, q, s)
    global _scale_min_k4
    orig = _scale_min_k4
    _scale_min_k4 = lambda m, j: orig(m, j ^ 1)
    try:
        mut = replay(raw, q, s, {"CM_NW": 8, "CM_FAST": 0})
    finally:
        _scale_min_k4 = orig
    caught = not np.array_equal(mut.view(np.uint32), ref.view(np.uint32))
    bad += not caught
    print(f"{'PASS' if caught else 'FAIL'}  mutation (sub-block pair scalars swapped) caught by the bit comparison", flush=True)
    return bad


def main() -> int:
    t0 = time.perf_counter()
    rng = np.random.default_rng(7)
    bad = fma_selftest(rng)
    bad += replay_selftest(rng)
    bad += replay_v2_selftest(rng)
    print(f"{'passed' if not bad else f'{bad} FAILED'} in {time.perf_counter() - t0:.1f} s")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
