#!/usr/bin/env python3
"""CPU selftest of experiments/gemm_wg/gemm_wg.cu's data paths, under wgmma's documented no-swizzle
K-major layout (core matrices of 8 rows x 16 bytes, LBO the K-direction step, SBO the M/N one:
WG_SWAP 0). From the addresses the kernel computes: produce()'s stage (raw weights, the activations
straight into the B tiles, scales, meta windows), unpack()'s A tiles; then D = A . B^T per k-chunk
read back through the accumulator layout (thread (warp w, lane): d[4 i + e] = D[16 w + gid + 8 (e >> 1)]
[8 i + 2 tig + (e & 1)]) against integer sums from GGUF semantics, every scale word the float part
reads, and every meta window load_meta reads. What it cannot check is the hardware's reading of the
descriptor fields (check.py's WG_SWAP 0 / 1 on the device does).

    python3 experiments/gemm_wg/selftest.py
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
import gemm_check as gc  # noqa: E402

BM = BN = 64


def core_off(r, k):
    return (r >> 3) * 256 + (k >> 4) * 128 + (r & 7) * 16 + (k & 15)


def wrow_of(r: int, ob: int, N: int, glu: bool) -> int:
    if not glu:
        return min(ob + r, N - 1)
    w, i = r >> 4, r & 15
    o = min(ob + 8 * w + (i & 7), N - 1)
    return o if i < 8 else o + N


def check_type(t: int, rng, glu: bool, K: int = 768) -> int:
    N = 45 if glu else 83
    nb = 50
    rows_w = 2 * N if glu else N
    bulk, meta, qv, xq, xs = gc.model_inputs(t, rows_w, K, nb, rng)
    bl, ml = bulk.ravel(), meta.ravel()
    xqb, xsb = xq.view(np.uint8).ravel(), xs.view(np.uint8).ravel()
    NCH, WBS, MW, MCP, MWS, SB, NK = gc.GT[t]
    nblk = K // gc.TYPES[t][1]
    brs, mrs = nblk * gc.TYPES[t][4], nblk * (gc.TYPES[t][2] - gc.TYPES[t][4])
    OFF_M = BM * WBS
    OFF_B = (OFF_M + BM * MWS + 127) // 128 * 128
    OFF_S = OFF_B + 2 * 2048
    lanes = np.arange(32)
    gid, tig = lanes >> 2, lanes & 3
    obm = 32 if glu else 64
    checked = 0
    for ob in range(0, N, obm):
        for u in range(K // 64):
            st = np.full(OFF_S + BN * 8 * SB, 0xAB, np.uint8)
            for r in range(BM):                      # weight bulk
                for c in range(NCH):
                    src = wrow_of(r, ob, N, glu) * brs + gc.chunk(t, u, c)
                    st[r * WBS + 16 * c:r * WBS + 16 * c + 16] = bl[src:src + 16]
            for col in range(BN):                    # activations into the B tiles
                b = min(col, nb - 1)
                for g in range(4):
                    dst = OFF_B + (g >> 1) * 2048 + core_off(col, 16 * (g & 1))
                    src = b * K + gc.goff(t, u, g)
                    st[dst:dst + 16] = xqb[src:src + 16]
                for c in range(SB // 2):             # scales
                    src = (b * (K // 32) + gc.goff(t, u, 0) // 32 + 2 * c) * 8
                    st[OFF_S + col * 8 * SB + 16 * c:OFF_S + col * 8 * SB + 16 * c + 16] = xsb[src:src + 16]
            for r in range(BM):                      # meta windows
                abs_ = wrow_of(r, ob, N, glu) * mrs + gc.moff(t, u)
                start = abs_ & ~(MCP - 1)
                for c in range(MW // MCP):
                    st[OFF_M + r * MWS + MCP * c:OFF_M + r * MWS + MCP * (c + 1)] = \
                        ml[start + MCP * c:start + MCP * (c + 1)]
                need = gc.META_NEED[t]
                assert np.array_equal(st[OFF_M + r * MWS:OFF_M + r * MWS + need], ml[abs_:abs_ + need]), \
                    f"{gc.TYPES[t][0]} u={u} row {r}: the meta window is not the unit's meta"
            A = np.full(2 * 2048, 0xCD, np.uint8)     # unpack(): thread (r, c)
            for r in range(BM):
                raw_r = st[r * WBS:r * WBS + WBS]
                for c in range(2):
                    if t == 12:
                        v = (raw_r[:32] & 15) if c == 0 else (raw_r[:32] >> 4)
                    elif t == 2:
                        blk = raw_r[16 * c:16 * c + 16]
                        v = np.concatenate([blk & 15, blk >> 4])
                    else:
                        v = raw_r[32 * c:32 * c + 32]
                    A[c * 2048 + core_off(r, np.arange(32))] = v
            for c in range(2):                       # wgmma: D = A . B^T on the documented layout
                Am = A[c * 2048 + core_off(np.arange(BM)[:, None], np.arange(32)[None, :])].view(np.int8).astype(np.int64)
                Bm = st[OFF_B + c * 2048 + core_off(np.arange(BN)[:, None], np.arange(32)[None, :])].view(np.int8).astype(np.int64)
                D = Am @ Bm.T
                for w in range(4):
                    for i in range(8):
                        for e in range(4):
                            m = 16 * w + gid + 8 * (e >> 1)
                            n = 8 * i + 2 * tig + (e & 1)
                            for L in range(32):
                                if n[L] >= nb:
                                    continue
                                el = 64 * u + 32 * c + np.arange(32)
                                ref = int((qv[wrow_of(int(m[L]), ob, N, glu), el].astype(np.int64) * xq[n[L], el]).sum())
                                assert int(D[m[L], n[L]]) == ref, f"{gc.TYPES[t][0]} u={u} m={m[L]} n={n[L]} c={c}"
                                checked += 1
            for i in range(8):                       # the scale words of the thread's columns
                for cc in range(2):
                    col = 8 * i + 2 * tig + cc
                    for L in range(32):
                        if col[L] >= nb:
                            continue
                        wds = st[OFF_S + col[L] * 8 * SB:OFF_S + col[L] * 8 * SB + 16].view(gc.Q8_SCALE)
                        for blk in range(2):
                            want = xs[col[L], 2 * u + blk]
                            assert wds[blk]["d"] == want["d"] and wds[blk]["s"] == want["s"], "scale word"
    return checked


def main() -> int:
    rng = np.random.default_rng(5)
    total = 0
    for t in (2, 12, 8):
        for glu in (False, True):
            total += check_type(t, rng, glu)
        print(f"{gc.TYPES[t][0]}: ok ({total} sums so far)", flush=True)
    print(f"selftest passed: {total} integer sums, every scale word and meta window", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
