#!/usr/bin/env python3
"""CPU emulation of one warp's ATT_TC tile (kernels/attention.cu's ATT_TC body, its index formulas transcribed) with the PTX fragment
layouts of ldmatrix (.trans), mma.m16n8k16 (row.col, f16 -> f32) and movmatrix.trans, against numpy: the
scores S^T = K Q^T and the output O^T += V^T P^T of one 16-key slice, through the swizzled ring layout, for
a warp a slice (ATT_TILE = 16 ATT_WARPS), a warp pair a slice (ATT_TILE = 8 ATT_WARPS: half the output each) and
a warp quad a slice (ATT_TILE = 4 ATT_WARPS, experiments/attn_quad: a quarter each).
A check of the kernel's indexing before its first device run, not of the hardware.

    python3 experiments/attn_tc/emulate.py        # prints the max errors; exits 1 on a mismatch
"""
import numpy as np

rng = np.random.default_rng(1)


def lanes():
    return [(l, l >> 2, l & 3) for l in range(32)]  # lane, gid, tig


def swz(row):
    return row & 7


def smem_rows(tile):
    """The ring stage as the kernel stores it: row r's 16-byte chunk c at chunk c ^ (r % 8)."""
    T, D = tile.shape
    s = np.zeros_like(tile)
    for r in range(T):
        for c in range(D // 8):
            s[r, 8 * (c ^ swz(r)):8 * (c ^ swz(r)) + 8] = tile[r, 8 * c:8 * c + 8]
    return s


def ldsm(smem, D, addr_of_lane, trans):
    """ldmatrix.x4: lane l supplies the address (row, chunk) of row l % 8 of matrix l // 8; returns regs[lane][i]
    = the 2 halves lane receives from matrix i."""
    mats = []
    for i in range(4):
        m = np.zeros((8, 8), dtype=smem.dtype)
        for j in range(8):
            row, ch = addr_of_lane(8 * i + j)
            m[j] = smem[row, 8 * ch:8 * ch + 8]
        mats.append(m)
    regs = {}
    for l, g, t in lanes():
        regs[l] = [(m[2 * t, g], m[2 * t + 1, g]) if trans else (m[g, 2 * t], m[g, 2 * t + 1]) for m in mats]
    return regs


def mma(C, A, B0, B1):
    """C[lane] (4 f32) += A (16x16) B (16x8) from fragments: A[lane] 4 pairs, B0/B1[lane] pairs."""
    Am = np.zeros((16, 16)); Bm = np.zeros((16, 8))
    for l, g, t in lanes():
        a = A[l]
        Am[g, 2 * t:2 * t + 2] = a[0]; Am[g + 8, 2 * t:2 * t + 2] = a[1]
        Am[g, 2 * t + 8:2 * t + 10] = a[2]; Am[g + 8, 2 * t + 8:2 * t + 10] = a[3]
        Bm[2 * t:2 * t + 2, g] = B0[l]; Bm[2 * t + 8:2 * t + 10, g] = B1[l]
    R = Am @ Bm
    for l, g, t in lanes():
        C[l] += np.array([R[g, 2 * t], R[g, 2 * t + 1], R[g + 8, 2 * t], R[g + 8, 2 * t + 1]])


def movtrans(X):
    """X[lane] = (orig[gid][2tig], orig[gid][2tig+1]) -> (orig[2tig][gid], orig[2tig+1][gid])."""
    M = np.zeros((8, 8))
    for l, g, t in lanes():
        M[g, 2 * t:2 * t + 2] = X[l]
    return {l: (M[2 * t, g], M[2 * t + 1, g]) for l, g, t in lanes()}


def main():
    worst = 0.0
    for (D, G), (W, TILE) in ((dg, wt) for dg in ((128, 4), (64, 3), (64, 8)) for wt in ((4, 64), (8, 64), (8, 128), (4, 32), (8, 32))):
        SL = TILE // 16; PAIR = W // SL; MT = D // 16 // PAIR   # tc_body.cuh's TC_SL, TC_PAIR, TC_MT
        K = rng.standard_normal((TILE, D)).astype(np.float16).astype(np.float64)
        V = rng.standard_normal((TILE, D)).astype(np.float16).astype(np.float64)
        Q = np.zeros((8, D)); Q[:G] = rng.standard_normal((G, D)).astype(np.float16)   # f16-exact: hi only
        ks_sm, vs_sm = smem_rows(K), smem_rows(V)
        for warp in range(W):
            slice_, mt0 = warp % SL, (warp // SL) * MT
            r0 = 16 * slice_
            s = {l: np.zeros(4) for l in range(32)}
            for ks in range(D // 16):
                A = ldsm(ks_sm, D, lambda ln: (r0 + (ln & 15), (2 * ks + (ln >> 4)) ^ swz(r0 + (ln & 15))), False)
                B0 = {l: (Q[g, 16 * ks + 2 * t], Q[g, 16 * ks + 2 * t + 1]) for l, g, t in lanes()}
                B1 = {l: (Q[g, 16 * ks + 8 + 2 * t], Q[g, 16 * ks + 8 + 2 * t + 1]) for l, g, t in lanes()}
                mma(s, A, B0, B1)
            ref = K[r0:r0 + 16] @ Q.T   # S^T: keys x heads
            for l, g, t in lanes():
                got = s[l]; want = [ref[g, 2 * t], ref[g, 2 * t + 1], ref[g + 8, 2 * t], ref[g + 8, 2 * t + 1]]
                worst = max(worst, float(np.max(np.abs(got - want))))
            # P^T = some values in the C layout; O^T = V^T P^T through movmatrix
            P = rng.random((16, 8)).astype(np.float16).astype(np.float64)    # keys x heads
            X0 = {l: (P[g, 2 * t], P[g, 2 * t + 1]) for l, g, t in lanes()}
            X1 = {l: (P[g + 8, 2 * t], P[g + 8, 2 * t + 1]) for l, g, t in lanes()}
            b0, b1 = movtrans(X0), movtrans(X1)
            O = {}
            for mt in range(mt0, mt0 + MT):   # the warp's output tiles (all of them without a pair)
                o = {l: np.zeros(4) for l in range(32)}
                A = ldsm(vs_sm, D, lambda ln: (r0 + (ln & 7) + ((ln >> 4) << 3),
                                               (2 * mt + ((ln >> 3) & 1)) ^ swz(r0 + (ln & 7) + ((ln >> 4) << 3))), True)
                mma(o, A, b0, b1)
                O[mt] = o
            ref = V[r0:r0 + 16].T @ P   # O^T: dims x heads
            for mt in range(mt0, mt0 + MT):
                for l, g, t in lanes():
                    got = O[mt][l]
                    want = [ref[16 * mt + g, 2 * t], ref[16 * mt + g, 2 * t + 1], ref[16 * mt + g + 8, 2 * t],
                            ref[16 * mt + g + 8, 2 * t + 1]]
                    worst = max(worst, float(np.max(np.abs(got - want))))
        print(f"D {D} G {G} {W} warps tile {TILE}: max |emulated - numpy| so far {worst:.3g}")
    return 0 if worst < 1e-9 else 1


if __name__ == "__main__":
    raise SystemExit(main())
