"""attn_walk (experiments/attn_walk/walk.cuh: one block walks a prefill row's splits) against
kernels/attention.cu's attn_decode over a prefill chunk as the engine launches it (grid y =
ATT.splits_for's split count, the whole GQA group a block): the same bits (out and its q8 twin)
and how fast, at two split counts: the engine's (default_splits over the table's one-head
blocks: 9 for the 8B and 1B, 30 SmolLM2, 66 Gemma-3) and the whole group's (default_splits over
the KV heads: 33 / 88 / 256), the count decode at depth gains from (research/2026-12-02-session12
depth/: 8B tg128 @ d4096 +12.7 %) but attn_decode's prefill loses 13-21 % to. On the H200:

    python3 experiments/attn_walk/check.py [smollm2 llama-1b llama3-8b gemma3] [--rows 512] [--depth 0,4096]

One JSON line per (shape, depth, split count, heads per block): us of attn_walk and of
attn_decode (graphs of 10 launches, medians), exact. Exit 1 on any difference. The plan holds if
attn_walk at the whole group's count is no slower than attn_decode at the engine's.
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

SRC = "../experiments/attn_walk/build/attention.cu"  # relative to kernels/


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("shapes", nargs="*", default=["smollm2", "llama-1b", "llama3-8b", "gemma3"])
    ap.add_argument("--rows", type=int, default=512)
    ap.add_argument("--depth", default="0,4096")
    args = ap.parse_args()
    make(HERE / "build" / "attention.cu")
    g = gpu()
    sms = g.info.sm_count
    rng = np.random.default_rng(0)
    T, bad = args.rows, 0
    for depth in (int(x) for x in args.depth.split(",")):
        for name in args.shapes:
            c = chunk_inputs(g, rng, name, T, depth)   # scratch for the whole group's count
            D, G, nkv, nh = c["D"], c["G"], c["nkv"], c["nh"]
            q, kc, vc, bt, pos, cnt = c["q"], c["kc"], c["vc"], c["bt"], c["pos"], c["cnt"]
            part_o, part_ml, max_blocks = c["part_o"], c["part_ml"], c["max_blocks"]
            twin = D % 32 == 0
            scale = 1 / math.sqrt(D)
            outs = {k: g.empty((T, nh * D), np.float32) for k in ("ref", "var")}
            xqs = {k: g.empty(T * nh * D, np.int8) for k in ("ref", "var")}
            xss = {k: g.empty(T * nh * D // 32, Q8_SCALE) for k in ("ref", "var")}
            for what, S_model in (("engine", ATT.default_splits(nh, sms)), ("group", ATT.default_splits(nkv, sms))):
                S = ATT.splits_for(depth + T, S_model, D)  # the prefill grid for these rows

                def ref(S=S):
                    ATT.attention(g, q, kc, vc, outs["ref"], part_o, part_ml, pos, None, bt, max_blocks, n_tokens=T,
                                  n_kv=nkv, n_gqa=G, head_dim=D, window=0, scale=scale, n_splits=S,
                                  counters=cnt, xq=xqs["ref"] if twin else None, xs=xss["ref"] if twin else None,
                                  hpb=G)

                outs["ref"].fill_bytes(0xFF)
                ref_us = graph_us(g, ref)
                a = outs["ref"].numpy().view(np.uint32).copy()
                aq = xqs["ref"].numpy().copy() if twin else None
                for hpb in sorted({G, 1}, reverse=True):
                    d = {"HEAD_DIM": D, "N_GQA": hpb, **ATT.defines(D, None), "KV_BLOCK": KV_BLOCK}
                    k = g.module(SRC, d).kernel("attn_walk")
                    nt = 32 * d["ATT_WARPS"]

                    def var(k=k, nt=nt, hpb=hpb, S=S):
                        g.launch(k, (nh // hpb, 1, T), (nt,),
                                 (q, kc, vc, part_o, part_ml, outs["var"],
                                  xqs["var"] if twin else np.uint64(0), xss["var"] if twin else np.uint64(0), pos,
                                  np.uint64(0), bt, np.int32(max_blocks), np.int32(nkv), np.int32(G),
                                  np.int32(0), np.float32(scale), np.float32(0.0), np.int32(S)))

                    outs["var"].fill_bytes(0xFF)
                    us = graph_us(g, var)
                    b = outs["var"].numpy().view(np.uint32)
                    exact = bool(np.array_equal(a, b)) and (not twin or bool(np.array_equal(aq, xqs["var"].numpy())))
                    bad += not exact
                    print(json.dumps({"shape": name, "rows": T, "depth": depth, "splits": what, "S_model": S_model,
                                      "S": S, "hpb": hpb, "us": round(us, 1), "ref_us": round(ref_us, 1),
                                      "speedup": round(ref_us / us, 3), "exact": exact}), flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
