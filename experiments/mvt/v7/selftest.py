#!/usr/bin/env python3
"""v7 selftest (CPU, numpy): MVT_SB's super-block walk and slot tree against mv_q8's float order.

A unit's contribution to an output enters a slot partial as P = fadd(P, c_u) (accum_k4f's last
operation; c_u depends on the unit alone, and is the same float in mvt and mv_q8: the same
RK4F row scalars from the same meta with constant j, the same exact integer sums). mv_q8: lane l
folds u = l, l + 32, ... in increasing u, then warp_sum's xor butterfly (offsets 16, 8, 4, 2, 1).
MVT_SB (kernels/mvt.cu, WK 8): warp k walks sb = k, k + 8, ... (the loop below is the kernel's,
statement for statement: the meta buffers M0 / M1 alternating, bulk slot j refilled with unit j of
sb + 8 right after unit j of sb is consumed), folds unit 4 sb + j into P[k][j]; red[4k + j] =
P[k][j]; then t[m] = t[m] + t[m + h], h = 16 .. 1 (level 16 straight from shared memory).
Checks: bit equality over random contributions (wide exponent range, so any order change shows),
nu = 4 .. 256 (every multiple of 4: empty slots, uneven slots), every consumed super-block is the
one its buffers hold (meta buffer and each bulk slot), each unit consumed once, each output written once (the warp -> output
map of the epilogue for plain / glu, TN 1 / 2), and the canary (unit 1 dropped) differs.
    python3 experiments/mvt/v7/selftest.py
"""
from __future__ import annotations

import sys

import numpy as np

f32 = np.float32


def mvq8_order(c: np.ndarray) -> np.float32:
    nu = len(c)
    v = [f32(0.0)] * 32
    for l in range(32):
        for u in range(l, nu, 32):
            v[l] = f32(v[l] + c[u])
    for off in (16, 8, 4, 2, 1):
        v = [f32(v[l] + v[l ^ off]) for l in range(32)]
    assert all(x.tobytes() == v[0].tobytes() for x in v)
    return v[0]


def sb_order(c: np.ndarray, canary: bool = False) -> np.float32:
    nu = len(c)
    assert nu % 4 == 0
    nsb, WK = nu // 4, 8
    seen = []
    red = [f32(0.0)] * 32
    for wk in range(WK):
        P = [f32(0.0)] * 4
        Q = [None] * 4            # unit held in bulk slot j (refilled in place)
        M = {"M0": None, "M1": None}   # super-block whose meta a buffer holds

        def fetch_meta(name, s):
            M[name] = s

        def consume_sb(mname, s, nx):
            assert M[mname] == s, "meta buffer holds another super-block"
            for j in range(4):
                u = 4 * s + j
                assert Q[j] == u, "bulk slot holds another unit"
                if not (canary and u == 1):
                    seen.append(u)
                    P[j] = f32(P[j] + c[u])
                if nx:
                    Q[j] = 4 * (s + WK) + j        # fetch_unit<j>(Q, 4 (sb + WK) + j)

        sb = wk
        if sb < nsb:
            fetch_meta("M0", sb)
            for j in range(4):
                Q[j] = 4 * sb + j
        while sb < nsb:
            nx = sb + WK < nsb
            if nx:
                fetch_meta("M1", sb + WK)
            consume_sb("M0", sb, nx)
            sb += WK
            if not nx:
                break
            nx = sb + WK < nsb
            if nx:
                fetch_meta("M0", sb + WK)
            consume_sb("M1", sb, nx)
            sb += WK
            if not nx:
                break
        for j in range(4):
            red[4 * wk + j] = P[j]
    if not canary:
        assert sorted(seen) == list(range(nu)), "every unit exactly once"
    t = list(red)
    h = 16
    while h:
        for m in range(h):
            t[m] = f32(t[m] + t[m + h])
        h //= 2
    return t[0]


def epilogue_cover() -> int:
    n = 0
    for glu in (False, True):
        for TN in (1, 2):
            NO = 4 * TN
            written = {}
            for wk in range(8):
                if wk >= (2 if glu else 4) * TN:
                    continue
                ni = wk >> 1 if glu else wk >> 2
                e = wk & 1 if glu else wk & 3
                o = 4 * ni + e
                outs = [o] if not glu else [o]   # glu: one output from (o, o + 2)
                for oo in outs:
                    written[oo] = written.get(oo, 0) + 1
                if glu:
                    assert o + 2 < NO and (o + 2) // 4 == ni and ((o + 2) & 3) >> 1 == 1
            want = [4 * ni + e for ni in range(TN) for e in (range(2) if glu else range(4))]
            assert sorted(written) == sorted(want) and all(v == 1 for v in written.values()), (glu, TN, written)
            n += 1
    return n


def main() -> int:
    rng = np.random.default_rng(7)
    n = bad = 0
    for nu in range(4, 260, 4):
        for rep in range(40):
            c = (rng.standard_normal(nu) * np.exp2(rng.integers(-12, 12, nu))).astype(f32)
            a, b = mvq8_order(c), sb_order(c)
            n += 1
            if a.tobytes() != b.tobytes():
                bad += 1
                print(f"MISMATCH nu {nu}: mv_q8 {a!r} sb {b!r}")
    # the canary must differ somewhere
    caught = 0
    for rep in range(20):
        c = (rng.standard_normal(64) * 4).astype(f32)
        caught += mvq8_order(c).tobytes() != sb_order(c, canary=True).tobytes()
    # a mutation: slots folded in walk order without the butterfly (sequential sum) must be caught
    mut = 0
    for rep in range(20):
        c = (rng.standard_normal(64) * np.exp2(rng.integers(-12, 12, 64))).astype(f32)
        s = f32(0.0)
        for x in c:
            s = f32(s + x)
        mut += s.tobytes() != mvq8_order(c).tobytes()
    cov = epilogue_cover()
    print(f"super-block walk vs mv_q8 order: {n - bad} of {n} reductions bit-equal; canary differs in "
          f"{caught}/20; sequential-sum mutation caught in {mut}/20; epilogue maps {cov} ok")
    return 0 if bad == 0 and caught > 0 and mut > 0 else 1


if __name__ == "__main__":
    sys.exit(main())
