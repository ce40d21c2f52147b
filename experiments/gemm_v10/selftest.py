#!/usr/bin/env python3
"""v10 selftest (CPU, numpy): GM_RSS (row scalars staged once per block row, one step early) and
GM_AOFF (Q4_0 / Q5_0's activation offset inside the integer dot) against mv_q8, bit for bit.

A. The GM_RSS pipeline schedule (kernels/gemm.cu, GM_STATIC_ON, statement for statement):
   shared-memory regions per stage slot (bulk, activations, scales, meta window, the bulk rows'
   pad holding the row scalars, column 0's activation pad holding the unit index), barrier
   intervals (the prologue = -1, step t = after barrier t), cp.async groups (group g = the
   prologue's p or step t's, complete from interval g on: wait<S - 2> before barrier t), plain
   stores visible from the next interval. Every read must see the intended position's content,
   never a region with a write in flight or in the same interval by another thread. S = 2..5,
   nu = 1..300 (the staged sequence = the static loop's / producer walk's), and mutations that
   must be caught (meta not issued early, the pass for the current instead of the next position,
   the unit index not stored, the early meta into the producer's slot).
B. Q4_K float replay: d, dmin as random f16 bit patterns (normal and subnormal, exponents over
   the whole f16 range), random 6-bit scales / mins, integer sums I (|I| < 2^16), block sums S,
   activation scales d over 2^+-40. mv_q8: lane slots with qtypes.cuh's accum_k4 (get_scale_min_k4,
   integer products, fma with one rounding), the xor butterfly. GM_STATIC + GM_RSS: the static
   pair loop of variant 9 over the staged sequence, each unit's RK4F taken from the slot pad the
   schedule of A says the consumer reads (rowscal_k4_uniform + rk4f, computed by the pass from
   that position's meta), accum_k4f. Exact fma: float64 product (exact) + TwoSum, rounded to f32
   with the error as the tie breaker.
C. GM_AOFF: the byte transform (q + 128 - k) ^ 0x80 = q - k as a signed byte, exhaustively over
   every byte value a Q4_0 (0..15, k 8) or Q5_0 (0..31, k 16) fragment holds and on random words
   (no carry between bytes); sum (q - k) x = I - k S for random blocks; the float replay of
   accum_r (ints - k S) against accum_aoff (the offset ints) per output, bit for bit, and a
   mutation (k off by one) caught.
    python3 experiments/gemm_v10/selftest.py
"""
from __future__ import annotations

import sys

import numpy as np

f32, f64 = np.float32, np.float64


def brev(i: int, bits: int) -> int:
    return int(f"{i:0{bits}b}"[::-1], 2)


def walk(nu: int) -> list[int]:
    """the producer's staged sequence (= the static loop's consumption order, gemm_v9/selftest.py)"""
    return [u for j in range(32) for u in range(brev(j, 5), nu, 32)]


# ------------------------------------------------------------------------------------------
# A. the schedule
class Hazard(Exception):
    pass


def schedule(nu: int, S: int, mut: str = "", xsf: bool = False):
    """Replays GM_RSS's (and GM_XSF's) staging; returns [(position, unit, unit whose row scalars
    the consumer read, position whose converted scales it read)]; raises Hazard on a race or a
    stale read."""
    seq = walk(nu)
    n = len(seq)
    content: dict = {}   # region -> [(write start interval, first interval valid, label)]

    def write(reg, label, start, valid_from):
        content.setdefault(reg, []).append((start, valid_from, label))

    def read(reg, t, who):
        cur = None
        for start, valid, label in content.get(reg, []):
            if start <= t < valid:
                raise Hazard(f"{who}: {reg} read in interval {t} while written ({label} from {start} to {valid})")
            if valid <= t and (cur is None or valid >= cur[0]):
                cur = (valid, label)
        if cur is None:
            raise Hazard(f"{who}: {reg} read in interval {t} before any write")
        return cur[1]

    # produce_step k (k = 0..n-1) in interval `iv`: position k's bulk, activations (and, without
    # XSF, scales) into slot k % S as group k (complete, after barrier k, from interval k on); with
    # RSS position k + 1's meta (XSF: and raw scales into the column pads) into slot (k + 1) % S,
    # also in group k
    def produce_step(k, iv):
        slot = k % S
        for r in (("bulk", "act") if xsf else ("bulk", "act", "scl")):
            write((r, slot), k, iv, k)
        if mut == "meta-not-early":
            write(("meta", slot), k, iv, k)
            if xsf:
                write(("xpad", slot), k, iv, k)
            return
        if k + 1 < n:
            ms = (k if mut == "meta-into-producer-slot" else k + 1) % S
            write(("meta", ms), k + 1, iv, k)
            if xsf:
                write(("xpad", ms), k + 1, iv, k)

    # the pass's walker (rj, ru): the producer's walk, advanced once per pass
    wpos = [1 if mut == "walker-ahead" else 0]

    def rs_pass(pos, iv, from_global):
        slot = pos % S
        u = seq[min(wpos[0], n - 1)]
        wpos[0] += 1
        if not from_global:
            m = read(("meta", slot), iv, "rs_pass meta")
            if m != pos:
                raise Hazard(f"rs_pass: meta of position {m} in slot {slot}, wanted {pos}")
            if xsf and read(("xpad", slot), iv, "xsf pass") != pos:
                raise Hazard("xsf pass: raw scales of another position")
        write(("rs", slot), (pos, u), iv, iv + 1)   # plain stores: visible after the next barrier
        if xsf:
            write(("scl", slot), pos, iv, iv + 1)

    for k in range(S - 1):   # prologue (interval -1)
        if k < n:
            produce_step(k, -1)
    if n:
        rs_pass(0, -1, True)
    out = []
    for t in range(n):
        # step t: cp_wait, barrier t, produce_step(t + S - 1), commit, the pass for t + 1, consume t
        if t + S - 1 < n:
            produce_step(t + S - 1, t)
        if t + 1 < n:
            rs_pass(t if mut == "pass-current" else t + 1, t, False)
        slot = t % S
        for r in ("bulk", "act"):
            if read((r, slot), t, "consume") != t:
                raise Hazard(f"consume: {r} of the wrong position")
        sc = read(("scl", slot), t, "consume scales")
        pos, u = read(("rs", slot), t, "consume rs")
        if pos != t:
            raise Hazard(f"consume: row scalars of position {pos} at position {t}")
        out.append((t, seq[t], u, sc))
    return out


def part_a() -> int:
    bad = 0
    cases = 0
    for xsf in (False, True):
        for S in (2, 3, 4, 5):
            for nu in range(1, 301):
                cases += 1
                try:
                    r = schedule(nu, S, xsf=xsf)
                    if [u for _, u, _, _ in r] != walk(nu) or any(u != ru or sc != t for t, u, ru, sc in r):
                        raise Hazard("unit mismatch")
                except Hazard as e:
                    bad += 1
                    print(f"FAIL schedule xsf={xsf} S={S} nu={nu}: {e}")
    print(f"A. GM_RSS (+ GM_XSF) schedule: {cases - bad} of {cases} (XSF off / on, S = 2..5, nu = 1..300) "
          f"race-free, every consumer read of the row scalars (and converted scales) = its own unit's")
    for mut in ("meta-not-early", "pass-current", "walker-ahead", "meta-into-producer-slot"):
        hit = 0
        for xsf in (False, True):
            for S in (2, 3, 4):
                for nu in (12, 40, 64, 224):
                    try:
                        r = schedule(nu, S, mut, xsf)
                        hit += any(u != ru or sc != t for t, u, ru, sc in r)
                    except Hazard:
                        hit += 1
        print(f"   mutation {mut:24s}: caught in {hit} of 24 cases")
        bad += hit == 0
    return bad


# ------------------------------------------------------------------------------------------
# exact float32 arithmetic
def rnd(s, e):
    """round s + e (float64 pair, |e| <= ulp(s) / 2, the exact value) to float32"""
    r = s.astype(f32)
    rd = r.astype(f64)
    toward = np.where(s > rd, np.inf, -np.inf).astype(f32)
    nb = np.nextafter(r, toward)
    mid = (rd + nb.astype(f64)) / 2
    tie = (s == mid) & (e != 0) & (rd != s)
    pick_nb = tie & (np.sign(e) == np.sign(nb.astype(f64) - rd))
    return np.where(pick_nb, nb, r).astype(f32)


def two_sum(a, b):
    s = a + b
    bb = s - a
    e = (a - (s - bb)) + (b - bb)
    return s, e


def fma(a, b, c):
    p = a.astype(f64) * b.astype(f64)        # exact: 24 + 24 bits
    s, e = two_sum(p, c.astype(f64))
    return rnd(s, e)


def fmul(a, b):
    return (a.astype(f64) * b.astype(f64)).astype(f32)   # exact product, one rounding


def fadd(a, b):
    return (a.astype(f64) + b.astype(f64)).astype(f32)   # exact sum of two f32 in f64, one rounding


def i2f(i):
    return np.asarray(i, np.int64).astype(f32)


# ------------------------------------------------------------------------------------------
# B. Q4_K
def scale_min_k4(sc: np.ndarray, j: int):
    """ggml's get_scale_min_k4 on the 12 scale bytes (rows x 12), sub-block j"""
    if j < 4:
        return sc[:, j] & 63, sc[:, j + 4] & 63
    return (sc[:, j + 4] & 0xF) | ((sc[:, j - 4] >> 6) << 4), (sc[:, j + 4] >> 4) | ((sc[:, j] >> 6) << 4)


def rowscal_uniform(m: np.ndarray, j: int):
    """mma_frag.cuh's rowscal_k4_uniform on the 16 meta bytes as words (rows x 4 uint32)"""
    s0, s1, s2 = m[:, 1], m[:, 2], m[:, 3]
    if j == 0:
        r = (s0 & 63, s1 & 63, (s0 >> 8) & 63, (s1 >> 8) & 63)
    elif j == 1:
        r = ((s0 >> 16) & 63, (s1 >> 16) & 63, (s0 >> 24) & 63, (s1 >> 24) & 63)
    elif j == 2:
        r = ((s2 & 0xF) | (((s0 >> 6) & 3) << 4), ((s2 >> 4) & 0xF) | (((s1 >> 6) & 3) << 4),
             ((s2 >> 8) & 0xF) | (((s0 >> 14) & 3) << 4), ((s2 >> 12) & 0xF) | (((s1 >> 14) & 3) << 4))
    else:
        r = (((s2 >> 16) & 0xF) | (((s0 >> 22) & 3) << 4), ((s2 >> 20) & 0xF) | (((s1 >> 22) & 3) << 4),
             ((s2 >> 24) & 0xF) | (((s0 >> 30) & 3) << 4), ((s2 >> 28) & 0xF) | (((s1 >> 30) & 3) << 4))
    d = (m[:, 0] & 0xFFFF).astype(np.uint16).view(np.float16).astype(f32)
    dmin = (m[:, 0] >> 16).astype(np.uint16).view(np.float16).astype(f32)
    return [x.astype(np.int64) for x in r], d, dmin


def rk4f(r, d, dmin):
    sc0, m0, sc1, m1 = r
    return fmul(d, i2f(sc0)), fmul(dmin, i2f(m0)), fmul(d, i2f(sc1)), fmul(dmin, i2f(m1))


def q4k_data(rng, nu, R, C):
    nsb = (nu + 3) // 4
    meta = rng.integers(0, 2**32, (R, nsb, 4), dtype=np.uint64).astype(np.uint32)
    # d, dmin: random f16 bits, finite, either sign of exponent range incl. subnormals; a few zeros
    h = rng.integers(0, 0x7C00, (R, nsb, 2)).astype(np.uint32)
    h[rng.random((R, nsb, 2)) < 0.03] = 0
    meta[:, :, 0] = h[:, :, 0] | (h[:, :, 1] << 16)
    I = rng.integers(-60960, 60961, (nu, 2, R, C))                  # |I| <= 32 * 15 * 127
    I[rng.random(I.shape) < 0.02] = 0
    S = rng.integers(-4064, 4065, (nu, 2, C))                        # |S| <= 32 * 127
    dx = (rng.uniform(0.5, 1, (nu, 2, C)) * np.exp2(rng.integers(-40, 40, (nu, 2, C)))).astype(f32)
    return meta, I, S, dx


def mvq8_q4k(meta, I, S, dx, nu):
    R, C = I.shape[2], I.shape[3]
    P = [np.zeros((R, C), f32) for _ in range(32)]
    for u in range(nu):
        m = meta[:, u >> 2, :]
        sc = np.stack([(m[:, k // 4] >> (8 * (k % 4))) & 0xFF for k in range(4, 16)], 1).astype(np.int64)
        j = u & 3
        sc0, m0 = scale_min_k4(sc, 2 * j)
        sc1, m1 = scale_min_k4(sc, 2 * j + 1)
        d = (m[:, 0] & 0xFFFF).astype(np.uint16).view(np.float16).astype(f32)[:, None]
        dmin = (m[:, 0] >> 16).astype(np.uint16).view(np.float16).astype(f32)[:, None]
        bc = lambda v: np.broadcast_to(v, (R, C))
        a = fma(bc(d), i2f(sc0[:, None] * I[u, 0]), -fmul(bc(dmin), i2f(m0[:, None] * S[u, 0][None, :])))
        b = fma(bc(d), i2f(sc1[:, None] * I[u, 1]), -fmul(bc(dmin), i2f(m1[:, None] * S[u, 1][None, :])))
        P[u % 32] = fadd(P[u % 32], fma(a, bc(dx[u, 0][None, :]), fmul(b, bc(dx[u, 1][None, :]))))
    for off in (16, 8, 4, 2, 1):
        P = [fadd(P[l], P[l ^ off]) for l in range(32)]
    return P[0]


def kernel_q4k(meta, I, S, dx, nu, S_stages, mut="", xsf=False):
    """GM_STATIC + GM_RSS (+ GM_XSF): the static pair loop; a unit's RK4F from the pad the schedule
    says; with XSF the column's (float)S from the converted scales of the position it read"""
    R, C = I.shape[2], I.shape[3]
    sched = schedule(nu, S_stages, xsf=xsf)
    seq = walk(nu)
    sf_of_unit = {u: (i2f(S[seq[sc], 0]), i2f(S[seq[sc], 1])) for _, u, _, sc in sched}
    rs_of_unit = {}
    for _, u, ru, _ in sched:   # the pass computed rowscal from the position's meta (unit ru) into the pad
        m = meta[:, ru >> 2, :]
        r, d, dmin = rowscal_uniform(m, (ru + (1 if mut == "wrong-j" else 0)) & 3)
        rs_of_unit[u] = rk4f(r, d, dmin)
    bc = lambda v: np.broadcast_to(v, (R, C))

    def step(acc, u):
        dsc0, dm0, dsc1, dm1 = (x[:, None] for x in rs_of_unit[u])
        Sf0, Sf1 = (x[None, :] for x in sf_of_unit[u])   # XSF: converted by the pass; else in place
        a = fma(bc(dsc0), i2f(I[u, 0]), -fmul(bc(dm0), bc(Sf0)))
        b = fma(bc(dsc1), i2f(I[u, 1]), -fmul(bc(dm1), bc(Sf1)))
        return fadd(acc, fma(a, bc(dx[u, 0][None, :]), fmul(b, bc(dx[u, 1][None, :]))))

    L = [np.zeros((R, C), f32) for _ in range(5)]
    P = np.zeros((R, C), f32)
    for i in range(16):
        sa = brev(i, 4)
        A, P = np.zeros((R, C), f32), np.zeros((R, C), f32)
        for u in range(sa, nu, 32):
            A = step(A, u)
        for u in range(sa + 16, nu, 32):
            P = step(P, u)
        P = fadd(A, P)
        for l in range(1, 5):
            if not (i >> (l - 1)) & 1:
                L[l] = P
                break
            P = fadd(L[l], P)
    return P


def same(a, b) -> bool:
    return np.array_equal(a.view(np.uint32), b.view(np.uint32))


def part_b(rng) -> int:
    bad = 0
    # the fma emulation against float64-exact cases and a brute check with Python fractions
    from fractions import Fraction
    a = (rng.standard_normal(4000) * np.exp2(rng.integers(-60, 60, 4000))).astype(f32)
    b = (rng.standard_normal(4000) * np.exp2(rng.integers(-60, 60, 4000))).astype(f32)
    c = (rng.standard_normal(4000) * np.exp2(rng.integers(-120, 0, 4000))).astype(f32)
    got = fma(a, b, c)
    ok = 0
    for i in range(4000):
        ex = Fraction(float(a[i])) * Fraction(float(b[i])) + Fraction(float(c[i]))
        # correct rounding via float64 neighbours of the exact value
        cand = np.float32(float(ex))
        lo, hi = sorted({cand, np.nextafter(cand, f32(np.inf)), np.nextafter(cand, f32(-np.inf))},
                        key=lambda v: abs(Fraction(float(v)) - ex))[:2]
        dl, dh = abs(Fraction(float(lo)) - ex), abs(Fraction(float(hi)) - ex)
        want = lo if dl < dh else hi if dh < dl else (lo if (int(lo.view(np.uint32)) & 1) == 0 else hi)
        ok += int(got[i].view(np.uint32)) == int(np.float32(want).view(np.uint32))
    print(f"B. fma emulation vs exact rationals: {ok} of 4000")
    bad += ok != 4000
    nus = [1, 3, 4, 5, 12, 31, 32, 33, 40, 64, 65, 100, 224]
    tot = 0
    for nu in nus:
        for S_st, xsf in ((2, False), (3, False), (2, True), (3, True)):
            meta, I, S, dx = q4k_data(rng, nu, 16, 24)
            ref = mvq8_q4k(meta, I, S, dx, nu)
            got = kernel_q4k(meta, I, S, dx, nu, S_st, xsf=xsf)
            tot += 1
            if not same(ref, got):
                bad += 1
                print(f"FAIL Q4_K nu={nu} S={S_st} xsf={xsf}: "
                      f"{np.count_nonzero(ref.view(np.uint32) != got.view(np.uint32))} differ")
    print(f"   Q4_K (16 rows x 24 columns, f16 d / dmin incl. subnormals, dx over 2^+-40): "
          f"{tot - bad} of {tot} (13 nu x stages 2, 3 x XSF off / on) bit-identical to mv_q8")
    meta, I, S, dx = q4k_data(rng, 64, 16, 24)
    hit = not same(mvq8_q4k(meta, I, S, dx, 64), kernel_q4k(meta, I, S, dx, 64, 3, "wrong-j"))
    print(f"   mutation wrong-j (the pass's j off by one): {'caught' if hit else 'NOT caught'}")
    bad += not hit
    return bad


# ------------------------------------------------------------------------------------------
# C. GM_AOFF
def aoff(v: np.ndarray, k: int) -> np.ndarray:
    return ((v.astype(np.uint64) + (128 - k) * 0x01010101) & 0xFFFFFFFF).astype(np.uint32) ^ np.uint32(0x80808080)


def bytes_s8(v: np.ndarray) -> np.ndarray:
    return v.view(np.int8).reshape(*v.shape, 4) if v.ndim else v


def part_c(rng) -> int:
    bad = 0
    for k, top in ((8, 16), (16, 32)):
        # exhaustive: every byte value in every byte position (others random in range)
        okb = True
        for pos in range(4):
            for q in range(top):
                w = rng.integers(0, top, (64, 4)).astype(np.uint32)
                w[:, pos] = q
                word = (w[:, 0] | (w[:, 1] << 8) | (w[:, 2] << 16) | (w[:, 3] << 24)).astype(np.uint32)
                got = aoff(word, k).view(np.int8).reshape(64, 4)
                okb &= np.array_equal(got.astype(np.int64), w.astype(np.int64) - k)
        # integer identity on blocks: sum (q - k) x = I - k S
        q = rng.integers(0, top, (2000, 32))
        x = rng.integers(-127, 128, (2000, 32))
        x[rng.random(2000) < 0.05] = -127
        words = np.zeros((2000, 8), np.uint32)
        for i in range(8):
            words[:, i] = q[:, 4 * i] | (q[:, 4 * i + 1] << 8) | (q[:, 4 * i + 2] << 16) | (q[:, 4 * i + 3] << 24)
        qs = aoff(words, k).view(np.int8).reshape(2000, 32).astype(np.int64)
        I, S = (q * x).sum(1), x.sum(1)
        oki = np.array_equal((qs * x).sum(1), I - k * S)
        # the float part per output: accum_r ((float)(I - k S)) vs accum_aoff ((float) of the offset ints)
        n = 20000
        Ib = rng.integers(-32 * top * 127, 32 * top * 127, (2, n))
        Sb = rng.integers(-4064, 4065, (2, n))
        d = rng.integers(0, 0x7C00, (2, n)).astype(np.uint16).view(np.float16).astype(f32)
        dx = (rng.uniform(0.5, 1, (2, n)) * np.exp2(rng.integers(-40, 40, (2, n)))).astype(f32)
        acc = (rng.standard_normal(n) * np.exp2(rng.integers(-20, 20, n))).astype(f32)
        r1, r2, r3 = np.zeros(n, f32), np.zeros(n, f32), np.zeros(n, f32)
        for b in range(2):
            r1 = fma(fmul(d[b], dx[b]), i2f(Ib[b] - k * Sb[b]), r1)   # accum_r (mv_q8)
            r2 = fma(fmul(d[b], dx[b]), i2f(Ib[b] - k * Sb[b]), r2)   # accum_aoff: ints = I - k S from the mma
            r3 = fma(fmul(d[b], dx[b]), i2f(Ib[b] - (k - 1) * Sb[b]), r3)   # mutation: k off by one
        okf = same(fadd(acc, r1), fadd(acc, r2))
        mut = not same(fadd(acc, r1), fadd(acc, r3))
        name = "Q4_0" if k == 8 else "Q5_0"
        print(f"C. GM_AOFF {name} (k = {k}): byte transform exhaustive {'OK' if okb else 'FAIL'}, "
              f"sum (q - k) x = I - k S on 2000 blocks {'OK' if oki else 'FAIL'}, float part {n} outputs "
              f"{'bit-identical' if okf else 'DIFFERS'}, mutation k - 1 {'caught' if mut else 'NOT caught'}")
        bad += not (okb and oki and okf and mut)
    return bad


def main() -> int:
    rng = np.random.default_rng(10)
    bad = part_a()
    bad += part_b(rng)
    bad += part_c(rng)
    print("selftest", "OK" if not bad else f"FAILED ({bad})")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
