"""gemm_f16.cu's index arithmetic, replayed on the CPU (no device): which weight row / x row / k every
shared-memory half holds after store_w and load_x, what ldmatrix hands each lane, the mma's operands
that follow from the fragment layouts (PTX ISA: mma.m16n8k16 .f16 A row-major a0..a3, B column-major
b0..b1, D d0..d3; ldmatrix .x4: lanes 8i..8i+7 address matrix i's rows, lane t receives row t/4,
columns 2(t%4), 2(t%4)+1 of each), and where the epilogue writes each accumulator. Checks that
every output (m, n) sums W[n, k] x[m, k] over every k exactly once (glu: gate row n and up row
N + n in the same thread). The formulas are copied from the kernel by hand: a slip in either shows.

    python3 experiments/gemm_f16/index_check.py
"""

from __future__ import annotations

import itertools
import sys

BK, LDS = 128, 136


def goff(t: str, u: int, g: int) -> int:
    if t == "Q6_K":
        j = u & 3
        return 256 * (u >> 2) + 128 * (j >> 1) + 32 * g + 16 * (j & 1)
    return 64 * u + 16 * g


def wrow(r: int, n0: int, N: int, glu: bool) -> int:
    if not glu:
        return n0 + r
    n = n0 + 8 * (r >> 4) + (r & 7)
    return N + n if r & 8 else n


def ldsm_x4(tags, addr_of_lane):
    """tags: dict (row, col) -> tag of the smem halves; addr_of_lane(l) -> (row, col) of the 8 halves lane l
    addresses. Returns per lane [4 registers][2 halves] of tags."""
    out = [[None] * 4 for _ in range(32)]
    for i in range(4):
        for t in range(32):
            r, c = addr_of_lane(8 * i + t // 4)
            c += 2 * (t % 4)
            out[t][i] = (tags[(r, c)], tags[(r, c + 1)])
    return out



def each_k_once(sums: dict, K: int) -> list[str]:
    """The first output (a key of sums: output -> its k terms) whose terms are not each of 0..K-1 exactly once."""
    for key, ks in sums.items():
        if sorted(ks) != list(range(K)):
            return [f"{key}: {len(ks)} k terms, not each of 0..{K - 1} once"]
    return []


def check(tname: str, cfg: dict, glu: bool, N: int, K: int, nb: int, n_block: int, m_block: int) -> list[str]:
    WM, WN, TM, TN = cfg["WM"], cfg["WN"], cfg["TM"], cfg["TN"]
    NT, BM, BN = 32 * WM * WN, 16 * TM * WM, 8 * TN * WN
    UPT, XPT = 2 * BM // NT, BN * (BK // 8) // NT
    m0 = m_block * BN
    n0 = n_block * (BM // 2 if glu else BM)
    S = K // BK
    sums: dict = {}          # (m, n, which) -> list of k
    errs: list[str] = []
    for s in range(S):
        Ws, Xs = {}, {}
        for tid in range(NT):                      # store_w(s)
            for p in range(UPT):
                i = tid + p * NT
                ur, uu = i >> 1, i & 1
                u = 2 * s + uu
                gr = wrow(ur, n0, N, glu)
                for g in range(4):
                    c = goff(tname, u, g) - BK * s
                    if not (0 <= c < BK and c % 16 == 0):
                        errs.append(f"goff out of the stage: {tname} u {u} g {g} c {c}")
                    for e in range(16):
                        key = (ur, c + e)
                        if key in Ws:
                            errs.append(f"Ws {key} written twice")
                        Ws[key] = (gr, goff(tname, u, g) + e)
            for p in range(XPT):                   # load_x(s)
                c = tid + p * NT
                r, col = c >> 4, 8 * (c & 15)
                for e in range(8):
                    Xs[(r, col + e)] = ((m0 + r) if m0 + r < nb else None, BK * s + col + e)
        if len(Ws) != BM * BK or len(Xs) != BN * BK:
            errs.append(f"stage {s}: Ws {len(Ws)} of {BM * BK}, Xs {len(Xs)} of {BN * BK} halves written")
            return errs
        for warp in range(WM * WN):
            wm, wn = warp // WN, warp % WN
            for kk in range(BK // 16):
                A = [ldsm_x4(Ws, lambda l, tm=tm: (wm * 16 * TM + 16 * tm + (l & 15), 16 * kk + 8 * (l >> 4)))
                     for tm in range(TM)]
                B = {}
                for tn in range(0, TN, 2):
                    r = ldsm_x4(Xs, lambda l, tn=tn: (wn * 8 * TN + 8 * tn + (l & 7) + 8 * (l >> 4),
                                                      16 * kk + 8 * ((l >> 3) & 1)))
                    for t in range(32):
                        B[(tn, t)] = (r[t][0], r[t][1])
                        B[(tn + 1, t)] = (r[t][2], r[t][3])
                for tm, tn in itertools.product(range(TM), range(TN)):
                    # the mma's operand matrices from the 32 lanes' fragments
                    Am = [[None] * 16 for _ in range(16)]
                    Bm = [[None] * 8 for _ in range(16)]
                    for t in range(32):
                        gid, tig = t >> 2, t & 3
                        a = A[tm][t]
                        for h in range(2):
                            Am[gid][2 * tig + h] = a[0][h]
                            Am[gid + 8][2 * tig + h] = a[1][h]
                            Am[gid][2 * tig + 8 + h] = a[2][h]
                            Am[gid + 8][2 * tig + 8 + h] = a[3][h]
                            Bm[2 * tig + h][gid] = B[(tn, t)][0][h]
                            Bm[2 * tig + 8 + h][gid] = B[(tn, t)][1][h]
                    # D[row][col] += sum_k A[row][k] B[k][col]; the epilogue's (m, n) of that accumulator
                    for t in range(32):
                        gid, tig = t >> 2, t & 3
                        for e in range(4):
                            row, col = gid + 8 * (e >> 1), 2 * tig + (e & 1)
                            m = m0 + wn * 8 * TN + 8 * tn + 2 * tig + (e & 1)
                            if glu:
                                n = n0 + 8 * (wm * TM + tm) + gid
                                which = "up" if e >> 1 else "gate"
                                want_row = N + n if which == "up" else n
                            else:
                                n = n0 + 16 * (wm * TM + tm) + gid + 8 * (e >> 1)
                                which, want_row = "y", n
                            for k in range(16):
                                (wr, wk), (xr, xk) = Am[row][k], Bm[k][col]
                                if wk != xk:
                                    errs.append(f"k mismatch {wk} != {xk}")
                                if wr != want_row:
                                    errs.append(f"weight row {wr} where the epilogue writes {which} of n {n}")
                                if m < nb and xr != m:
                                    errs.append(f"x row {xr} where the epilogue writes m {m}")
                                if m < nb:
                                    sums.setdefault((m, n, which), []).append(wk)
                            if len(errs) > 20:
                                return errs
    errs += each_k_once(sums, K)
    outs = {(m, n) for m, n, _ in sums}
    n_out = BM // 2 if glu else BM
    want = {(m, n) for m in range(m0, min(m0 + BN, nb)) for n in range(n0, n0 + n_out)}
    if outs != want:
        errs.append(f"outputs covered {len(outs)}, want {len(want)}")
    return errs


def main() -> int:
    bad = 0
    for cfg in (dict(WM=2, WN=4, TM=4, TN=4), dict(WM=2, WN=4, TM=8, TN=4), dict(WM=2, WN=2, TM=4, TN=4)):
        for tname, glu in (("Q4_K", True), ("Q6_K", False), ("Q4_0", False)):
            N = 2 * (16 * cfg["TM"] * cfg["WM"])
            errs = check(tname, cfg, glu, N=N, K=256, nb=150, n_block=1, m_block=1)
            print(cfg, tname, "glu" if glu else "plain", "OK" if not errs else errs[:5], flush=True)
            bad += bool(errs)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
