#!/usr/bin/env python3
"""CPU selftest of kernels/mvt.cu layout 1's index maps and order (variant 6, first written for experiments/mvt/v6/mvt.cu, landed in session 13).

1. Staging and fragments: the stage bytes as v6's produce_w / produce_x write them (numpy, from the
   addresses the kernel computes), then each warp's units read back as unit() reads them (ldmatrix
   through gemm_check's model, the meta window, the scale words), turned into A fragments and mma
   results by gemm_check's models, against integer sums from GGUF semantics; every scale word
   against the activation blocks it stands for.
2. Order: v6's per-slot partials (folded in K order, then the butterfly's levels 16 .. WK inside
   the warp, then WK / 2 .. 1 across warps) against mv_q8's lane order and butterfly, bit for bit.

    python3 experiments/mvt/v6/selftest.py          # every type, plain and glu, WK 4 / 8 / 16, UPW 1 / 2
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))
sys.path.insert(0, str(HERE.parent))
import gemm_check as gc  # noqa: E402
import mvt_check as mc  # noqa: E402

TYPES = gc.TYPES


def geometry(t: int, WK: int, UPW: int, TN: int, WM: int = 1):
    """v6's constants (mvt.cu's constexprs)."""
    _, blk, bb, _, bulk = TYPES[t]
    meta = bb - bulk
    SU = WK * UPW
    BPU = bulk * 64 // blk
    MST = SU * 64 // blk * meta
    TR, BN = 16 * WM, 8 * TN
    WROW, MROW, XROW, SROW = SU * BPU + 16, (MST + 4 + 15) // 16 * 16, SU * 64 + 16, SU * 16
    OFF_M = TR * WROW
    OFF_X = OFF_M + TR * MROW
    OFF_S = OFF_X + BN * XROW
    return dict(SU=SU, BPU=BPU, MST=MST, TR=TR, BN=BN, WROW=WROW, MROW=MROW, XROW=XROW, SROW=SROW,
                OFF_M=OFF_M, OFF_X=OFF_X, OFF_S=OFF_S, STAGE=OFF_S + BN * SROW, meta=meta, blk=blk, bulk=bulk)


def wrow_of(r: int, ob0: int, N: int, glu: bool) -> int:
    t_, i = r >> 4, r & 15
    if glu:
        o = min(ob0 + 8 * t_ + (i & 7), N - 1)
        return o if i < 8 else o + N
    return min(ob0 + 16 * t_ + i, N - 1)


def stage_bytes(t, G, u0, bl, ml, xqb, xsb, N, K, nb, nu, ob0, cb, glu, brs, mrs):
    """produce_w + produce_x of the stage starting at unit u0, as the kernel addresses them."""
    sm = np.full(G["STAGE"], 0xAB, np.uint8)   # poison: a read of an unwritten byte shows up
    wlim = (nu - u0) * G["BPU"]
    for r in range(G["TR"]):
        row = wrow_of(r, ob0, N, glu)
        for c in range(G["SU"] * G["BPU"] // 16):
            if 16 * c < wlim:
                src = row * brs + u0 * G["BPU"] + 16 * c
                sm[r * G["WROW"] + 16 * c:r * G["WROW"] + 16 * c + 16] = bl[src:src + 16]
        rb = row * mrs
        s = rb + gc.moff(t, u0)
        for c in range(G["MROW"] // 4):
            p = (s & ~3) + 4 * c
            left = rb + mrs - p
            if 4 * c < G["MST"] + 4 and left > 0:
                n = min(4, left)
                dst = G["OFF_M"] + r * G["MROW"] + 4 * c
                sm[dst:dst + 4] = 0
                sm[dst:dst + n] = ml[p:p + n]
    xlim, slim = (nu - u0) * 64, (nu - u0) * 2
    for col in range(G["BN"]):
        b = min(cb + col, nb - 1)
        for c in range(G["SU"] * 64 // 16):
            if 16 * c < xlim:
                src = b * K + u0 * 64 + 16 * c
                sm[G["OFF_X"] + col * G["XROW"] + 16 * c:G["OFF_X"] + col * G["XROW"] + 16 * c + 16] = xqb[src:src + 16]
        for c in range(G["SROW"] // 16):
            if 2 * c < slim:
                src = (b * (K // 32) + 2 * u0 + 2 * c) * 8
                sm[G["OFF_S"] + col * G["SROW"] + 16 * c:G["OFF_S"] + col * G["SROW"] + 16 * c + 16] = xsb[src:src + 16]
    return sm


def check_type(t: int, rng, glu: bool, WK: int, UPW: int, TN: int, K: int) -> int:
    N = 21 if glu else 37
    nb = 8 * TN - 3
    rows_w = 2 * N if glu else N
    bulk, meta, qv, xq, xs = gc.model_inputs(t, rows_w, K, nb, rng)
    bl, ml = bulk.ravel(), meta.ravel()
    xqb, xsb = xq.view(np.uint8).ravel(), xs.view(np.uint8).ravel()
    G = geometry(t, WK, UPW, TN)
    nblk = K // TYPES[t][1]
    brs, mrs = nblk * TYPES[t][4], nblk * G["meta"]
    nch, nk = gc.GT[t][0], gc.GT[t][6]
    k16 = nk == 4
    lanes = np.arange(32)
    gid, tig, lr, lm = lanes >> 2, lanes & 3, lanes & 7, lanes >> 3
    nu, NS = K // 64, 32 // WK
    obm = 8 if glu else 16
    checked = 0
    for ob0 in range(0, N, obm):
        for cb in range(0, nb, 8 * TN):
            for s in range((nu + G["SU"] - 1) // G["SU"]):
                u0 = s * G["SU"]
                sm = stage_bytes(t, G, u0, bl, ml, xqb, xsb, N, K, nb, nu, ob0, cb, glu, brs, mrs)
                for wk in range(WK):
                    for i in range(UPW):
                        u = u0 + wk + WK * i
                        if u >= nu:
                            continue
                        assert (u % 32 - wk) % WK == 0 and (u % 32 - wk) // WK == (UPW * s + i) % NS, "slot index"
                        r0 = 0   # wm = 0 (one tile a block)
                        q = [[None, None] for _ in range(nch)]
                        for c in range(0, nch - 1, 2):
                            addr = (r0 + 8 * (lm & 1) + lr) * G["WROW"] + \
                                np.array([gc.chunk(t, u, c + (m >> 1)) for m in lm]) - u0 * G["BPU"]
                            r4 = gc.model_ldsm(sm, addr, 4)
                            q[c][0], q[c][1], q[c + 1][0], q[c + 1][1] = r4
                        if nch % 2:
                            addr = (r0 + 8 * (lm & 1) + lr) * G["WROW"] + gc.chunk(t, u, nch - 1) - u0 * G["BPU"]
                            r2 = gc.model_ldsm(sm, addr, 2)
                            q[nch - 1][0], q[nch - 1][1] = r2
                        mw = []
                        for rh in range(2):
                            rows = [r0 + g + 8 * rh for g in gid]
                            win = []
                            for r in rows:
                                sh = ((wrow_of(r, ob0, N, glu) * mrs + gc.moff(t, u0)) & 3)
                                o = G["OFF_M"] + r * G["MROW"] + sh + gc.moff(t, u) - gc.moff(t, u0)
                                win.append(sm[o:o + gc.META_NEED[t]])
                            mw.append(np.stack(win))
                        a = gc.model_afrag(t, q, mw, u, tig)
                        sb = gc.goff(t, u, 0) // 32 - 2 * u0
                        for ni in range(TN):
                            if ni == 1 and not cb + 8 < nb:
                                continue
                            addr = G["OFF_X"] + (8 * ni + lr) * G["XROW"] + \
                                np.array([gc.goff(t, u, m) for m in lm]) - 64 * u0
                            xb = gc.model_ldsm(sm, addr, 4)
                            checked += mc.tile_sums(t, a, xb, u, cb + 8 * ni, nb,
                                                    lambda r: wrow_of(r, ob0, N, glu), qv, xq)
                            for cc in range(2):
                                colS = np.minimum(cb + 8 * ni + 2 * tig + cc, nb - 1)
                                sp = G["OFF_S"] + (8 * ni + 2 * tig + cc) * G["SROW"] + 8 * sb
                                assert np.all(sp % 16 == 0), "scale uint4 read not 16-byte aligned"
                                for g in range(4):
                                    e = g if k16 else g >> 1
                                    for L in range(32):
                                        got = sm[sp[L] + 8 * e:sp[L] + 8 * e + 8].view(gc.Q8_SCALE)[0]
                                        want = xs[colS[L], gc.goff(t, u, g) // 32]
                                        assert got["d"] == want["d"] and got["s"] == want["s"], \
                                            f"{TYPES[t][0]} u={u} g={g}: scale mismatch"
    return checked


def v6_order(c: np.ndarray, wk: int, upw: int) -> np.float32:
    """v6: warp k folds units u = k + WK i (stage order: increasing u) into P[(u % 32 - k) / WK],
    then P[m] + P[m + h] for h = NS / 2 .. 1, then the warps in offsets WK / 2 .. 1."""
    nu, ns = c.size, 32 // wk
    roots = []
    for k in range(wk):
        P = [np.float32(0)] * ns
        for u in range(k, nu, wk):
            m = (u % 32 - k) // wk
            P[m] = np.float32(P[m] + c[u])
        h = ns // 2
        while h:
            for m in range(h):
                P[m] = np.float32(P[m] + P[m + h])
            h //= 2
        roots.append(P[0])
    return gc.meet_roots(roots, wk)


def main() -> int:
    rng = np.random.default_rng(3)
    n = 0
    for nu in (1, 5, 12, 31, 32, 40, 64, 224):
        for _ in range(20):
            c = (rng.standard_normal(nu) * rng.choice([1e-3, 1, 1e3], nu)).astype(np.float32)
            want = mc.mv_order(c)
            for wk in (4, 8, 16):
                got = v6_order(c, wk, 1)
                assert got.view(np.uint32) == want.view(np.uint32), f"order: nu={nu} wk={wk}: {got} != {want}"
                n += 1
    print(f"order: {n} reductions bit-identical to mv_q8's", flush=True)
    total = 0
    for t in TYPES:
        for glu in (False, True):
            for WK, UPW, TN, K in ((8, 1, 1, 768), (4, 2, 1, 2560), (16, 1, 2, 768)):
                total += check_type(t, rng, glu, WK, UPW, TN, K)
        print(f"{TYPES[t][0]}: staging and fragments ok ({total} sums so far)", flush=True)
    print(f"selftest passed: {total} integer sums, every scale word", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
