"""CPU evidence for GT_ORDER 1 of the slot-order tile (gemm_tile.patch): a numpy/python transcription
of its position table (build_table), stage gather (load_group / load_meta / load_xs: which K bytes land in
which stage chunk) and K-loop fold points (fold_mask), replayed per type and K:

 1. index check: for every stage and step j (k32 block j of the stage's chain layout), the global k32
    block that the weight bytes, the xq bytes, the Q8Scale and the meta (Q4_K: super-block and sub-block
    2 (u % 4) + h; Q4_0 / Q8_0: the f16 d at 4 v + 2 h) come from is one and the same block;
 2. order check: the sequence of blocks and fold points a output sees equals the definition (slot l's
    blocks 2u, 2u + 1 for u = l, l + 32, .. in increasing k, a fold after each non-empty slot);
 3. bit check: the kernel's arithmetic replayed in that order (acc, tot = +0, fold tot = fl(tot + acc),
    acc = +0) with memra.gpu.chain's per-block step equals memra.gpu.chain.slot_chain bit for bit.

    python3 experiments/slot_order/tile/replay.py      (~1 min, CPU)
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

RB = {2: 128, 8: 256, 12: 128}   # raw weight bytes a row and stage (chain layout)


def table(U: int) -> list[tuple[int, bool]]:
    """build_table: position p -> (unit, last of its slot)."""
    q, r = U >> 5, U & 31
    big = r * (q + 1)
    out = []
    for p in range(U):
        if p < big:
            l, i, n = p // (q + 1), p % (q + 1), q + 1
        else:
            l = r + (p - big) // q
            i, n = p - big - (l - r) * q, q
        out.append((l + 32 * i, i == n - 1))
    return out


def stage_sources(t: int, tb, s: int):
    """For stage s: per step j the global block each operand is loaded from (the gather's byte maps)."""
    units = [tb[4 * s + v][0] for v in range(4)]
    rb, cpu = RB[t], RB[t] // 64          # chunks (16 B) a unit
    wblk = {}                              # stage weight byte -> global bulk byte (row-relative)
    for c in range(rb // 16):
        v = c // cpu
        for b in range(16):
            wblk[16 * c + b] = (rb // 4) * units[v] + 16 * (c - cpu * v) + b
    xblk = {}                              # stage activation byte -> global k
    for c in range(16):
        v = c >> 2
        for b in range(16):
            xblk[16 * c + b] = 64 * units[v] + 16 * (c & 3) + b
    steps = []
    for j in range(8):
        v, h = j >> 1, j & 1
        u = units[v]
        # weights: the bytes step j's ldmatrix reads in the chain layout
        if t == 12:   # pair jp = v: 32 bytes at 32 v; global qs byte -> super-block, group -> block 8 sb + 2 g + h
            gb = {wblk[32 * v + b] for b in range(32)}
            wb = {(x // 128) * 8 + 2 * ((x % 128) // 32) + h for x in gb}
        elif t == 2:  # block j: 16 bytes at 16 j (16 B a block)
            wb = {wblk[16 * j + b] // 16 for b in range(16)}
        else:         # Q8_0 block j: 32 bytes at 32 j
            wb = {wblk[32 * j + b] // 32 for b in range(32)}
        xb = {xblk[32 * j + b] // 32 for b in range(32)}          # B fragments of step j: bytes 32 j ..
        sb = 2 * units[j >> 1] + (j & 1)                           # load_xs: chunk v = scales of 2u, 2u + 1
        if t == 12:   # row pass: meta of super-block u / 4, sub-block 2 (u % 4) + h
            mb = 8 * (u >> 2) + 2 * (u & 3) + h
        else:         # load_meta: 4 bytes at 4 u (f16 d of 2u, 2u + 1) to 4 v; row pass reads d of step j at 2 j
            mb = (4 * u + 2 * h) // 2
        steps.append((wb, xb, sb, mb))
    return steps


def check_indices(t: int, K: int) -> list[tuple[int, bool]]:
    U = K // 64
    tb = table(U)
    assert sorted(u for u, _ in tb) == list(range(U))
    seq = []   # (block, fold after it)
    for s in range(K // 256):
        fm = [tb[4 * s + v][1] for v in range(4)]
        for j, (wb, xb, sb, mb) in enumerate(stage_sources(t, tb, s)):
            assert len(wb) == 1 and len(xb) == 1, (t, K, s, j, wb, xb)
            b = wb.pop()
            assert b == xb.pop() == sb == mb, (t, K, s, j, b, sb, mb)
            seq.append((b, bool((j & 1) and fm[j >> 1])))
    want = []
    for l in range(32):
        us = list(range(l, U, 32))
        for k, u in enumerate(us):
            want += [(2 * u, False), (2 * u + 1, k == len(us) - 1)]
    assert seq == want, (t, K)
    return seq


def replay(t: int, K: int, rows: int = 8, nb: int = 3, seed: int = 0) -> int:
    from memra.gpu import chain as CH
    from memra.gpu.ops import matvec as MV
    from memra.gpu.q8 import quantize_q8_ref

    rng = np.random.default_rng(seed)
    raw = MV.random_weight(t, rows, K, rng)
    x = (rng.standard_normal((nb, K)) * 3).astype(np.float32)
    q, s = quantize_q8_ref(x)
    step, _, _, _ = CH._block_step(raw, t, q, s["d"], s["s"])
    acc = np.zeros((rows, nb), np.float32)
    tot = np.zeros((rows, nb), np.float32)
    for b, fold in check_indices(t, K):
        acc = step(acc, b)
        if fold:
            tot = (tot + acc).astype(np.float32)
            acc = np.zeros_like(acc)
    got = tot.T
    want = CH.slot_chain(raw, t, q, s["d"], s["s"])
    return int(np.count_nonzero(got.view(np.uint32) != want.view(np.uint32)))


if __name__ == "__main__":
    bad = 0
    for t in (2, 8, 12):
        for K in (256, 768, 1024, 2048, 2304, 4096, 14336, 4096 + 256 * 3):
            check_indices(t, K)
            nd = replay(t, K) if K in (256, 768, 2048, 2304, 4096, 14336) else 0
            bad += nd
            tb = table(K // 64)
            print(f"type {t:2d} K {K:5d}: U {K // 64:3d}, folds {sum(f for _, f in tb):2d}, "
                  f"stages with a fold {len({p // 4 for p, (_, f) in enumerate(tb) if f}):3d} of {K // 256:3d}; "
                  f"index + order OK; replay vs slot_chain: {nd} differing values", flush=True)
    print("ALL OK" if not bad else f"{bad} DIFFER")
    sys.exit(1 if bad else 0)
