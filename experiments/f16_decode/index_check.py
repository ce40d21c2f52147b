"""mv_f16.cu's index arithmetic replayed on the CPU (no device), as experiments/gemm_f16/index_check.py does for
gemm_f16.cu: per warp its (tile, chain), per stage which weight row, unit and k each tile half holds after the
dequant's stores, what ldmatrix hands each lane, the B words each lane loads from x, and where the fold and the
epilogue put each accumulator. Checks that every output (m < nb, n) sums W[n, k] x[m, k] over every k exactly once
(its chains together), that no live warp's tile is written twice in a stage, and that glu's gate and up rows meet
in one thread. The formulas are copied from the kernel by hand: a slip in either shows.

    python3 experiments/f16_decode/index_check.py
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "gemm_f16"))
from index_check import each_k_once, goff, ldsm_x4, wrow  # noqa: E402

LDS = 136


def xperm_src(p: int) -> int:
    """MF_XP's activation layout: the k (in a row) whose value sits at position p of the fragment-ordered row — per
    128-k stage s, lane group tig's 32 halves (8 k16 steps kk, each the words k0 = 16 kk + 2 tig and k0 + 8, 2
    halves a word) in order. probe.py's xperm builds rows this way."""
    s, r = divmod(p, 128)
    tig, r = divmod(r, 32)
    kk, r = divmod(r, 4)
    j, e = divmod(r, 2)
    return 128 * s + 16 * kk + 8 * j + 2 * tig + e



def scol(tname: str, ui: int, g: int) -> int:
    """mv_f16.cu's SCol<T>::at: the stage column of group g of the stage's unit ui."""
    return 32 * g + 16 * ui if tname == "Q6_K" else 64 * ui + 16 * g


def stage_kk(tname: str, s: int, ui: int, g: int, errs: list[str]) -> int:
    """The k16 step of group g of stage s's unit ui (mv_f16.cu's SCol<T>::at / 16), checked against goff."""
    if goff(tname, 2 * s + ui, g) - 128 * s != scol(tname, ui, g):
        errs.append(f"SCol {tname} ui {ui} g {g} != goff - 128 s at s {s}")
    return scol(tname, ui, g) // 16


def check(tname: str, W: int, C: int, glu: bool, N: int, K: int, nb: int, xp: bool = False,
          df: bool = False) -> list[str]:
    tiles = (2 * N if glu else N) // 16
    blocks = -(-tiles * C // W)
    S = K // C // 128
    sums: dict = {}
    errs: list[str] = []
    for blk in range(blocks):
        # per warp its chain's accumulator terms, per lane and register: list of (weight row, k, x row)
        acc = {}
        for warp in range(W):
            pair = blk * W + warp
            if pair >= tiles * C:
                continue
            tile, chain = pair // C, pair % C
            n0 = tile * (8 if glu else 16)
            s0 = chain * S
            terms = {(t, e): [] for t in range(32) for e in range(4)}
            for s in range(s0, s0 + S):
                Ws = {}
                for lane in range(32):   # the dequant's stores
                    ur, uu = lane & 15, lane >> 4
                    u = 2 * s + uu
                    gr = wrow(ur, n0, N, glu)
                    for g in range(4):
                        c = goff(tname, u, g) - 128 * s
                        if not (0 <= c < 128 and c % 16 == 0):
                            errs.append(f"goff out of the stage: u {u} g {g} c {c}")
                        for e in range(16):
                            if (ur, c + e) in Ws:
                                errs.append(f"tile half {(ur, c + e)} written twice")
                            Ws[(ur, c + e)] = (gr, goff(tname, u, g) + e)
                if len(Ws) != 16 * 128:
                    errs.append(f"stage {s}: {len(Ws)} tile halves of {16 * 128}")
                    return errs
                if df:   # MF_DF: lane (gid, tig)'s slice of rows gid, gid + 8 and units 2 s, 2 s + 1 into its A fragments
                    Adf = {}
                    for lane in range(32):
                        gid, tig = lane >> 2, lane & 3
                        for r in range(2):
                            gr = wrow(gid + 8 * r, n0, N, glu)
                            for ui in range(2):
                                u = 2 * s + ui
                                for g in range(4):
                                    kk = stage_kk(tname, s, ui, g, errs)
                                    els = [(gr, goff(tname, u, g) + 4 * tig + e) for e in range(4)]
                                    Adf[(lane, kk, r)] = els[0:2]       # a[r]: slots 2 tig, 2 tig + 1
                                    Adf[(lane, kk, 2 + r)] = els[2:4]   # a[2 + r]: slots 2 tig + 8, + 9
                for kk in range(8):
                    if df:
                        A = [[Adf[(lane, kk, q)] for q in range(4)] for lane in range(32)]
                    else:
                        A = ldsm_x4(Ws, lambda l, kk=kk: ((l & 15), 16 * kk + 8 * (l >> 4)))
                    Am = [[None] * 16 for _ in range(16)]
                    Bm = [[None] * 8 for _ in range(16)]
                    for t in range(32):
                        gid, tig = t >> 2, t & 3
                        a = A[t]
                        k0 = 128 * s + 16 * kk + 2 * tig
                        for h in range(2):
                            Am[gid][2 * tig + h] = a[0][h]
                            Am[gid + 8][2 * tig + h] = a[1][h]
                            Am[gid][2 * tig + 8 + h] = a[2][h]
                            Am[gid + 8][2 * tig + 8 + h] = a[3][h]
                            # b0 = x[gid][k0, k0 + 1], b1 = x[gid][k0 + 8, k0 + 9] (zero where gid >= nb); MF_XP:
                            # b[kk][j] is word (kk & 1) 2 + j of uint4 kk / 2 at half 128 s + 32 tig of the row
                            if xp:
                                p0 = 128 * s + 32 * tig + 8 * (kk >> 1) + 2 * (2 * (kk & 1))
                                src0, src1 = xperm_src(p0 + h), xperm_src(p0 + 2 + h)
                            elif df:   # one uint2 at x + k0 - 2 tig + 4 tig: b0 its low word, b1 its high
                                src0, src1 = k0 + 2 * tig + h, k0 + 2 * tig + 2 + h
                            else:
                                src0, src1 = k0 + h, k0 + 8 + h
                            Bm[2 * tig + h][gid] = (gid, src0) if gid < nb else None
                            Bm[2 * tig + 8 + h][gid] = (gid, src1) if gid < nb else None
                    for t in range(32):
                        gid, tig = t >> 2, t & 3
                        for e in range(4):
                            row, col = gid + 8 * (e >> 1), 2 * tig + (e & 1)
                            for k in range(16):
                                (wr, wk), xb = Am[row][k], Bm[k][col]
                                if xb is None:
                                    continue
                                if xb[1] != wk:
                                    errs.append(f"k mismatch {wk} != {xb[1]}")
                                terms[(t, e)].append((wr, wk, xb[0]))
            acc[warp] = (tile, chain, n0, terms)
        # the fold: chain-0 warps add warps warp + 1 .. warp + C - 1 (the same tile's chains, in order)
        for warp, (tile, chain, n0, terms) in acc.items():
            if chain != 0:
                continue
            for c in range(1, C):
                if acc.get(warp + c, (None, None))[:2] != (tile, c):
                    errs.append(f"block {blk} warp {warp}: warp {warp + c} is not chain {c} of tile {tile}")
            for t in range(32):
                gid, tig = t >> 2, t & 3
                m = 2 * tig
                if glu:
                    n = n0 + gid
                    for e in range(2):
                        if m + e >= nb:
                            continue
                        for which, ee, want in (("gate", e, n), ("up", 2 + e, N + n)):
                            for c in range(C):
                                for wr, wk, xr in acc[warp + c][3][(t, ee)]:
                                    if wr != want or xr != m + e:
                                        errs.append(f"{which} of (m {m + e}, n {n}): row {wr}, x row {xr}")
                                    sums.setdefault((m + e, n, which), []).append(wk)
                else:
                    for e in range(4):
                        mm, nn = m + (e & 1), n0 + gid + 8 * (e >> 1)
                        if mm >= nb:
                            continue
                        for c in range(C):
                            for wr, wk, xr in acc[warp + c][3][(t, e)]:
                                if wr != nn or xr != mm:
                                    errs.append(f"y (m {mm}, n {nn}): row {wr}, x row {xr}")
                                sums.setdefault((mm, nn, "y"), []).append(wk)
            if len(errs) > 20:
                return errs
    errs += each_k_once(sums, K)
    whiches = ("gate", "up") if glu else ("y",)
    want = {(m, n, w) for m in range(nb) for n in range(N) for w in whiches}
    if set(sums) != want:
        errs.append(f"outputs covered {len(set(sums))}, want {len(want)}")
    return errs


def check_df2(tname: str, C: int, glu: bool, N: int, K: int, nb: int) -> list[str]:
    """MF_DF 2 (v7): 8 weight rows a warp as mma's B operand, the activation rows as A. Per warp (tile, chain) and
    stage, lane (gid, tig)'s B column gid = weight row wr(gid) with its slice's elements in slots 2 tig, + 1 / 2 tig
    + 8, + 9, and A's row gid from x at k0 + 4 tig; checks that every slot pairs the same k, that every output
    (m < nb, n) sums each k once over its chains, and that glu's gate and up meet in one lane."""
    errs: list[str] = []
    tiles = (2 * N if glu else N) // 8
    S = K // C // 128
    sums: dict = {}
    for tile in range(tiles):
        n0 = tile * (4 if glu else 8)
        for chain in range(C):
            for s in range(chain * S, (chain + 1) * S):
                for ui in range(2):
                    u = 2 * s + ui
                    for g in range(4):
                        kk = stage_kk(tname, s, ui, g, errs)
                        k0 = 128 * s + 16 * kk
                        Am = [[None] * 16 for _ in range(16)]
                        Bm = [[None] * 8 for _ in range(16)]
                        for lane in range(32):
                            gid, tig = lane >> 2, lane & 3
                            wr = ((N + n0 + (gid >> 1)) if gid & 1 else n0 + (gid >> 1)) if glu else n0 + gid
                            for h in range(2):
                                Bm[2 * tig + h][gid] = (wr, goff(tname, u, g) + 4 * tig + h)
                                Bm[2 * tig + 8 + h][gid] = (wr, goff(tname, u, g) + 4 * tig + 2 + h)
                                if gid < nb:
                                    Am[gid][2 * tig + h] = (gid, k0 + 4 * tig + h)
                                    Am[gid][2 * tig + 8 + h] = (gid, k0 + 4 * tig + 2 + h)
                        for m in range(nb):
                            for n in range(8):
                                for slot in range(16):
                                    (xm, xk), (wr, wk) = Am[m][slot], Bm[slot][n]
                                    if xk != wk or xm != m:
                                        errs.append(f"A row {xm} k {xk} against output row {m} k {wk}")
                                    sums.setdefault((m, wr), []).append(wk)
                if len(errs) > 20:
                    return errs
    # the epilogue: lane (gid, tig) holds D[gid][2 tig + e]; glu: columns 2 tig / 2 tig + 1 are one output's gate / up
    for m in range(nb):
        for tile in range(tiles):
            n0 = tile * (4 if glu else 8)
            for tig in range(4):
                if glu:
                    gate, up = n0 + tig, N + n0 + tig
                    if (m, gate) not in sums or (m, up) not in sums:
                        errs.append(f"glu output {n0 + tig}: gate / up not both summed")
                else:
                    for e in range(2):
                        if (m, n0 + 2 * tig + e) not in sums:
                            errs.append(f"output {n0 + 2 * tig + e} not summed")
    errs += each_k_once(sums, K)
    want = {(m, r) for m in range(nb) for r in range(2 * N if glu else N)}
    if set(sums) != want:
        errs.append(f"weight rows covered {len(set(sums))}, want {len(want)}")
    return errs


def main() -> int:
    bad = 0
    for W, C in ((4, 1), (8, 4), (4, 2), (8, 8)):
        for tname, glu in (("Q4_K", True), ("Q6_K", False), ("Q4_0", False), ("Q4_0", True)):
            N, K = 48, 256 * C
            for nb, xp, df in ((1, False, False), (3, True, False), (8, False, False), (8, True, False),
                               (2, False, True), (8, False, True)):
                errs = check(tname, W, C, glu, N=N, K=K, nb=nb, xp=xp, df=df)
                bad += bool(errs)
                if errs or nb == 8:
                    print(f"MF_WARPS {W} MF_CHAINS {C} MF_XP {int(xp)} MF_DF {int(df)} {tname} "
                          f"{'glu' if glu else 'plain'} nb {nb}:", "OK" if not errs else errs[:5], flush=True)
    for C in (1, 2, 4):
        for tname, glu in (("Q4_K", True), ("Q6_K", False), ("Q4_0", True)):
            for nb in (1, 8):
                errs = check_df2(tname, C, glu, N=48, K=256 * C, nb=nb)
                bad += bool(errs)
                if errs or nb == 8:
                    print(f"MF_DF 2 MF_CHAINS {C} {tname} {'glu' if glu else 'plain'} nb {nb}:",
                          "OK" if not errs else errs[:5], flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
