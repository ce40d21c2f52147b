#!/usr/bin/env python3
"""v9 selftest (CPU, numpy): GM_STATIC's static slot structure against mv_q8's float order, bit for bit.

A unit enters a slot partial through G<T>::accum, a fixed sequence of explicitly rounded float
operations whose only dependence on the order is the partial it starts from. The model's accum,
P' = fl(fl(P * c_u) + x_u), is order-sensitive in the same way (and, with c_u < 0 and x_u = -0,
makes signed zeros, so a skipped +0 add would show). Every statement is float32 with one rounding.

  mv_q8 (reference): lane l folds u = l, l + 32, ... (u < nu) in increasing u from +0, then
      warp_sum's xor butterfly, offsets 16, 8, 4, 2, 1 (v_l = v_l + v_(l ^ off)); lane 0's value.
  slot walk (gemm.cu today, GM_WK 1): leaves j = 0..31, slot brev5(j), merge(j) as the kernel's
      binary counter (leading / trailing empty slots merged as +0).
  GM_STATIC=1 (kernels/gemm.cu + experiments/gemm_v9/gemm.patch, statement for statement): pairs
      i = 0..15, slot a = brev4(i) into A (= Lr[0]), slot a + 16 into P, P = A + P, then for
      l = 1..4: bit l - 1 of i clear -> park P at level l, else P = L_l + P; the root after i = 15.
      Also the unit sequence it consumes (the producer's order) and that each unit is consumed once.
Checks: nu = 1 .. 300 (nu < 32: empty slots; nu not a multiple of 32: uneven slots; 64, 224),
many outputs each, random c_u, x_u over a wide exponent range; then mutations must be caught
(units of a slot in decreasing order, slots not bit-reversed, the park level off by one, an empty
slot's add skipped), and one non-mutation must not (A and P swapped: float addition commutes).
    python3 experiments/gemm_v9/selftest.py
"""
from __future__ import annotations

import sys

import numpy as np

f32 = np.float32


def brev(i: int, bits: int) -> int:
    return int(f"{i:0{bits}b}"[::-1], 2)


def accum(p, c, x):
    return (p * c).astype(f32) + x   # two float32 operations, each rounded


def mvq8(c, x, nu):
    n = c.shape[1]
    v = [np.zeros(n, f32) for _ in range(32)]
    for l in range(32):
        for u in range(l, nu, 32):
            v[l] = accum(v[l], c[u], x[u])
    for off in (16, 8, 4, 2, 1):
        v = [(v[l] + v[l ^ off]).astype(f32) for l in range(32)]
    return v[0]


def slot_walk(c, x, nu):
    """gemm.cu's slot walk (GM_WK 1, LV 5): merge(j) after leaf j."""
    n = c.shape[1]
    P = np.zeros(n, f32)
    L = [np.zeros(n, f32) for _ in range(5)]
    for j in range(32):
        for u in range(brev(j, 5), nu, 32):
            P = accum(P, c[u], x[u])
        tz = (~j & -~j).bit_length() - 1   # trailing ones of j
        v = P
        for l in range(min(tz, 5)):
            v = (L[l] + v).astype(f32)
        if tz >= 5:
            P = v
        else:
            L[tz] = v
            P = np.zeros(n, f32)
    return P


def static9(c, x, nu, mut: str = "", seq=None):
    """GM_STATIC=1's consumer loop, statement for statement (mut: a deliberate change)."""
    n = c.shape[1]
    A, P = np.zeros(n, f32), np.zeros(n, f32)
    L = [np.zeros(n, f32) for _ in range(5)]
    for i in range(16):
        sa = i if mut == "no-brev" else brev(i, 4)
        A, P = np.zeros(n, f32), np.zeros(n, f32)
        us = list(range(sa, nu, 32))
        for u in (us[::-1] if mut == "units-reversed" else us):
            A = accum(A, c[u], x[u])
            if seq is not None:
                seq.append(u)
        for u in range(sa + 16, nu, 32):
            P = accum(P, c[u], x[u])
            if seq is not None:
                seq.append(u)
        if mut == "swap-AP":
            A, P = P, A
        if mut == "skip-empty-add" and sa + 16 >= nu:
            P = A   # leaf 2i + 1 empty: its +0 not added
        else:
            P = (A + P).astype(f32)
        for l in range(1, 5):
            if not (i >> (l - 1)) & 1:
                L[l + 1 if (mut == "park-off" and l < 4) else l] = P
                break
            P = (L[l] + P).astype(f32)
    return P


def data(rng, nu, n):
    c = (rng.uniform(0.5, 1.5, (nu, n)) * rng.choice([-1.0, 1.0], (nu, n))).astype(f32)
    x = (rng.standard_normal((nu, n)) * np.exp2(rng.integers(-30, 30, (nu, n)))).astype(f32)
    x[rng.random((nu, n)) < 0.05] = f32(-0.0)   # signed zeros: P * c may be -0, -0 + -0 = -0
    return c, x


def same(a, b) -> bool:
    return np.array_equal(a.view(np.uint32), b.view(np.uint32))


def main() -> int:
    rng = np.random.default_rng(9)
    n = 512
    bad = 0
    nus = list(range(1, 301))
    for nu in nus:
        c, x = data(rng, nu, n)
        ref = mvq8(c, x, nu)
        seq: list[int] = []
        s9 = static9(c, x, nu, seq=seq)
        sw = slot_walk(c, x, nu)
        ok = same(ref, s9) and same(ref, sw) and sorted(seq) == list(range(nu))
        # the producer stages units in the slot walk's leaf order: the same sequence
        walk = [u for j in range(32) for u in range(brev(j, 5), nu, 32)]
        ok = ok and seq == walk
        if not ok:
            bad += 1
            print(f"FAIL nu={nu}: static {same(ref, s9)} walk {same(ref, sw)} units {sorted(seq) == list(range(nu))} "
                  f"order {seq == walk}")
    print(f"nu = 1..300, {n} outputs each: {len(nus) - bad} of {len(nus)} bit-identical to mv_q8 "
          f"(GM_STATIC=1 and the slot walk; the unit sequence = the producer's)")
    # signed-zero probe: c = -1, x = -0 makes a slot with an odd number of units exactly -0 and an
    # empty slot +0; mv_q8's adds of the empty slots' +0 turn -0 + +0 into +0 (nu = 16: slots 0..15 -0)
    zc = lambda nu: (np.full((nu, 8), -1.0, f32), np.full((nu, 8), -0.0, f32))
    zok = all(same(mvq8(*zc(nu), nu), static9(*zc(nu), nu)) for nu in range(1, 65))
    zsign = mvq8(*zc(16), 16).view(np.uint32)[0]
    print(f"signed-zero probe nu = 1..64: {'bit-identical' if zok else 'DIFFERS'} (nu = 16: mv_q8 gives "
          f"{'+0' if zsign == 0 else hex(zsign)})")
    bad += not zok
    caught = {}
    for mut in ("units-reversed", "no-brev", "park-off", "skip-empty-add", "swap-AP"):
        hit = 0
        for nu in (12, 40, 64, 100, 224):
            c, x = data(rng, nu, n)
            hit += not same(mvq8(c, x, nu), static9(c, x, nu, mut))
        hit += not same(mvq8(*zc(16), 16), static9(*zc(16), 16, mut))
        caught[mut] = hit
        want = mut != "swap-AP"
        print(f"mutation {mut:15s}: differs at {hit} of 6 cases (5 K values + the zero probe) ({'caught' if hit else 'not caught'}; "
              f"{'must be caught' if want else 'must not differ: commutative'})")
        if want != (hit > 0):
            bad += 1
    print("selftest", "OK" if not bad else f"FAILED ({bad})")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
