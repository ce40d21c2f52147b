"""attn_prefill_rows (experiments/attn_rows2/rows.cuh: attn_decode's arithmetic for ATT_ROWS
token rows a block) against kernels/attention.cu's attn_decode over a prefill chunk, as the
engine launches it now (grid y = ATT.splits_for's split count): the same bits (out and its q8
twin), and how fast. On the H200:

    python3 experiments/attn_rows2/check.py [smollm2 llama-1b llama3-8b gemma3] [--rows 512]
        [--depth 0,4096] [--R 1,2,4,8] [--vh 8]

One JSON line per (shape, depth, heads per block, R): us of the variant and of attn_decode
(graphs of 10 launches, medians), exact. Exit 1 on any difference. R = 1 with the whole GQA
group a block is attn_decode's own layout: the harness's control.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np

from memra.gpu.cuda import gpu
from memra.gpu.ops import attention as ATT
from memra.gpu.q8 import Q8_SCALE

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))
from attn_prefill_probe import KV_BLOCK, chunk_inputs, graph_us  # noqa: E402
from make import make  # noqa: E402

SRC = "../experiments/attn_rows2/build/attention.cu"  # relative to kernels/


def key_range(p: int, window: int, S: int, min_chunk: int = 128, tile: int = 64):
    """kernels/attention.cu's key_range: (lo, n, chunk, n_active)."""
    hi = p + 1
    lo = max(0, hi - window) if window > 0 else 0
    n = hi - lo
    chunk = max(min_chunk, -(-(-(-n // S)) // tile) * tile)
    return lo, n, chunk, -(-n // chunk) if chunk > 0 else 0


def row_groups(pos, window: int, S: int, R: int) -> np.ndarray:
    """int32 [n, 2] (first row, count): at most R consecutive rows sharing lo and chunk."""
    out, t, T = [], 0, len(pos)
    while t < T:
        lo, _, ch, _ = key_range(int(pos[t]), window, S)
        e = t + 1
        while e < T and e - t < R and key_range(int(pos[e]), window, S)[::2] == (lo, ch):
            e += 1
        out.append((t, e - t))
        t = e
    return np.array(out, np.int32)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("shapes", nargs="*", default=["smollm2", "llama-1b", "llama3-8b", "gemma3"])
    ap.add_argument("--rows", type=int, default=512)
    ap.add_argument("--depth", default="0,4096")
    ap.add_argument("--R", default="1,2,4,8")
    ap.add_argument("--vh", type=int, default=8, help="at most this many rows x heads a block")
    ap.add_argument("--window", type=int, default=0)
    args = ap.parse_args()
    make(HERE / "build" / "attention.cu")
    g = gpu()
    rng = np.random.default_rng(0)
    T, bad = args.rows, 0
    for depth in (int(x) for x in args.depth.split(",")):
        for name in args.shapes:
            c = chunk_inputs(g, rng, name, T, depth)
            D, G, nkv, nh, S_plan = c["D"], c["G"], c["nkv"], c["nh"], c["S"]
            q, kc, vc, bt, pos, cnt = c["q"], c["kc"], c["vc"], c["bt"], c["pos"], c["cnt"]
            part_o, part_ml, max_blocks = c["part_o"], c["part_ml"], c["max_blocks"]
            S = ATT.splits_for(depth + T, S_plan, D)  # the engine's prefill grid now
            pos_h = np.arange(depth, depth + T, dtype=np.int32)
            twin = D % 32 == 0
            scale = 1 / math.sqrt(D)
            outs = {k: g.empty((T, nh * D), np.float32) for k in ("ref", "var")}
            cntv = g.to_device(np.zeros(T * nh, np.int32))  # the variant's: [rows][n_head / heads per block]
            xqs = {k: g.empty(T * nh * D, np.int8) for k in ("ref", "var")}
            xss = {k: g.empty(T * nh * D // 32, Q8_SCALE) for k in ("ref", "var")}

            def ref():
                ATT.attention(g, q, kc, vc, outs["ref"], part_o, part_ml, pos, None, bt, max_blocks, n_tokens=T,
                              n_kv=nkv, n_gqa=G, head_dim=D, window=args.window, scale=scale, n_splits=S,
                              counters=cnt, xq=xqs["ref"] if twin else None, xs=xss["ref"] if twin else None, hpb=G)

            ref_us = graph_us(g, ref)
            a = outs["ref"].numpy().view(np.uint32).copy()
            aq = xqs["ref"].numpy().copy() if twin else None
            for hpb in sorted({G, 1}, reverse=True):
                for R in (int(x) for x in args.R.split(",")):
                    if R * hpb > args.vh:
                        continue
                    d = {"HEAD_DIM": D, "N_GQA": hpb, **ATT.defines(D, None), "KV_BLOCK": KV_BLOCK, "ATT_ROWS": R}
                    try:
                        k = g.module(SRC, d).kernel("attn_prefill_rows")
                    except Exception as e:  # noqa: BLE001 (a configuration that does not build: say so)
                        print(json.dumps({"shape": name, "depth": depth, "hpb": hpb, "R": R,
                                          "error": str(e)[:300]}), flush=True)
                        continue
                    tab = g.to_device(row_groups(pos_h, args.window, S, R))
                    ng = int(tab.shape[0])
                    nt = 32 * d["ATT_WARPS"]

                    def var(k=k, tab=tab, ng=ng, nt=nt, hpb=hpb):
                        g.launch(k, (ng, nh // hpb, S), (nt,),
                                 (q, kc, vc, part_o, part_ml, cntv, outs["var"],
                                  xqs["var"] if twin else np.uint64(0), xss["var"] if twin else np.uint64(0), pos,
                                  np.uint64(0), bt, np.int32(max_blocks), np.int32(nkv), np.int32(G),
                                  np.int32(args.window), np.float32(scale), np.float32(0.0), tab))

                    outs["var"].fill_bytes(0xFF)
                    us = graph_us(g, var)
                    b = outs["var"].numpy().view(np.uint32)
                    exact = bool(np.array_equal(a, b)) and (not twin or bool(np.array_equal(aq, xqs["var"].numpy())))
                    left = int(np.count_nonzero(cntv.numpy()))
                    bad += (not exact) or left > 0
                    print(json.dumps({"shape": name, "rows": T, "depth": depth, "splits": S, "hpb": hpb, "R": R,
                                      "us": round(us, 1), "ref_us": round(ref_us, 1),
                                      "speedup": round(ref_us / us, 3), "exact": exact,
                                      "counters_left": left}), flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
