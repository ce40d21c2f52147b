"""The decode attention kernel over a prefill chunk: how long attn_decode takes for T rows of one
sequence (positions depth .. depth + T - 1), as the prefill step launches it (every query head of a
KV head in one block from MEMRA_ATT_GROUP_ROWS rows, the model's default split count, no q8 twin),
per model head shape. The number to beat for a multi-row variant (docs/PERFORMANCE.md, "Session
10": the prefill attention with decode's bits), and the launch to put under ncu:

    python3 experiments/attn_prefill_probe.py [smollm2 llama-1b llama3-8b] [--rows 512] [--depth 0]
    ncu -k regex:attn_decode --launch-count 1 --set full python3 experiments/attn_prefill_probe.py smollm2 --once

One JSON line per shape: us per launch (median of a graph of 10 launches), keys read, FLOPs.
"""
from __future__ import annotations

import argparse
import json
import math

import numpy as np

from memra.gpu.cuda import gpu
from memra.gpu.ops import attention as ATT

SHAPES = {  # name: (head_dim, query heads per KV head, KV heads)
    "smollm2": (64, 3, 3), "llama-1b": (64, 4, 8), "llama3-8b": (128, 4, 8), "gemma3": (256, 4, 1)}
KV_BLOCK = 16


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("shapes", nargs="*", default=["smollm2", "llama-1b", "llama3-8b"])
    ap.add_argument("--rows", type=int, default=512)
    ap.add_argument("--depth", type=int, default=0)
    ap.add_argument("--once", action="store_true", help="one launch per shape, no timing (for ncu)")
    args = ap.parse_args()
    g = gpu()
    rng = np.random.default_rng(0)
    T, depth = args.rows, args.depth
    n_ctx = depth + T
    max_blocks = (n_ctx + KV_BLOCK - 1) // KV_BLOCK
    for name in args.shapes:
        D, G, nkv = SHAPES[name]
        nh = nkv * G
        row = nkv * D
        kc = g.to_device((rng.standard_normal((max_blocks, KV_BLOCK, row)) * 0.5).astype(np.float16).view(np.uint16))
        vc = g.to_device(rng.standard_normal((max_blocks, KV_BLOCK, row)).astype(np.float16).view(np.uint16))
        bt = g.to_device(np.arange(max_blocks, dtype=np.int32)[None, :])
        q = g.to_device(rng.standard_normal((T, nh * D)).astype(np.float32))
        out = g.empty((T, nh * D), np.float32)
        pos = g.to_device(np.arange(depth, depth + T, dtype=np.int32))
        hpb = G   # the prefill step's blocks take the whole GQA group (MEMRA_ATT_GROUP_ROWS)
        S = ATT.default_splits(nh // hpb, g.info.sm_count)
        po, pml = ATT.scratch_shapes(T, nh, S, D)
        part_o, part_ml = g.empty(po, np.float32), g.empty(pml, np.float32)
        cnt = g.to_device(np.zeros(T * nh // hpb, np.int32))

        def one():
            ATT.attention(g, q, kc, vc, out, part_o, part_ml, pos, None, bt, max_blocks, n_tokens=T, n_kv=nkv,
                          n_gqa=G, head_dim=D, window=0, scale=1 / math.sqrt(D), n_splits=S, counters=cnt, hpb=hpb)

        one()
        g.sync()
        keys = int(sum(min(p + 1, n_ctx) for p in range(depth, depth + T)))
        rec = {"shape": name, "rows": T, "depth": depth, "splits": S, "hpb": hpb, "keys": keys,
               "gflop": round(4.0 * keys * nh * D * 1e-9, 3)}
        if not args.once:
            with g.capture() as gr:
                for _ in range(10):
                    one()
            gr.upload()
            us = float(np.median(g.time_ms(gr.launch, reps=10, warmup=3))) * 1e3 / 10
            gr.close()
            rec.update(us=round(us, 1), tflops=round(rec["gflop"] / us * 1e3, 2))   # GFLOP / us = 1e3 TFLOP/s
        print(json.dumps(rec), flush=True)


if __name__ == "__main__":
    main()
