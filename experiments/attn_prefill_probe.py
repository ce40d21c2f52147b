"""The decode attention kernel over a prefill chunk: how long attn_decode takes for T rows of one
sequence (positions depth .. depth + T - 1), as the prefill step launches it (every query head of a
KV head in one block from MEMRA_ATT_GROUP_ROWS rows, the model's default split count, no q8 twin),
per model head shape. The number to beat for a multi-row variant (docs/PERFORMANCE.md, "Session
10": the prefill attention with decode's bits), and the launch to put under ncu:

    python3 experiments/attn_prefill_probe.py [smollm2 llama-1b llama3-8b] [--rows 512] [--depth 0]
    ncu -k regex:attn_decode --launch-count 1 --set full python3 experiments/attn_prefill_probe.py smollm2 --once
    # a decode step's launch at depth (one row, the table's one head a block), outside any graph:
    ncu -k regex:attn_decode --launch-count 1 --set full python3 experiments/attn_prefill_probe.py llama3-8b \
        --rows 1 --depth 4096 --hpb 1 --once

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


def chunk_inputs(g, rng, name: str, T: int, depth: int) -> dict:
    """A prefill chunk's attention inputs on the device: T rows of one sequence at positions
    depth .. depth + T - 1 over a paged KV pool (identity block table) holding depth + T keys,
    with the prefill step's heads per block (the whole GQA group) and the engine's split count S:
    default_splits over the table's one-head blocks (the H200 table's attention entries all take
    hpb 1: 9 on the 8B and 1B, 30 on SmolLM2, 66 on Gemma-3). Scratch is sized for S_group too,
    the whole group's count (default_splits over the KV heads: 33 / 88 / 256)."""
    D, G, nkv = SHAPES[name]
    nh, n_ctx = nkv * G, depth + T
    max_blocks = (n_ctx + KV_BLOCK - 1) // KV_BLOCK
    S = ATT.default_splits(nh, g.info.sm_count)
    S_group = ATT.default_splits(nkv, g.info.sm_count)
    po, pml = ATT.scratch_shapes(T, nh, max(S, S_group), D)
    return dict(
        D=D, G=G, nkv=nkv, nh=nh, n_ctx=n_ctx, max_blocks=max_blocks, hpb=G, S=S, S_group=S_group,
        kc=g.to_device((rng.standard_normal((max_blocks, KV_BLOCK, nkv * D)) * 0.5).astype(np.float16).view(np.uint16)),
        vc=g.to_device(rng.standard_normal((max_blocks, KV_BLOCK, nkv * D)).astype(np.float16).view(np.uint16)),
        bt=g.to_device(np.arange(max_blocks, dtype=np.int32)[None, :]),
        q=g.to_device(rng.standard_normal((T, nh * D)).astype(np.float32)),
        pos=g.to_device(np.arange(depth, depth + T, dtype=np.int32)),
        part_o=g.empty(po, np.float32), part_ml=g.empty(pml, np.float32),
        cnt=g.to_device(np.zeros(T * nkv, np.int32)))


def graph_us(g, fn, n: int = 10, reps: int = 10) -> float:
    """µs of one fn() launch: a graph of n launches (after an eager one), median of reps."""
    fn()
    g.sync()
    with g.capture() as gr:
        for _ in range(n):
            fn()
    gr.upload()
    us = float(np.median(g.time_ms(gr.launch, reps=reps, warmup=3))) * 1e3 / n
    gr.close()
    return us


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("shapes", nargs="*", default=["smollm2", "llama-1b", "llama3-8b"])
    ap.add_argument("--rows", type=int, default=512)
    ap.add_argument("--depth", type=int, default=0)
    ap.add_argument("--once", action="store_true", help="one launch per shape, no timing (for ncu)")
    ap.add_argument("--hpb", type=int, default=0, help="heads per block (default: the whole GQA group, as prefill)")
    ap.add_argument("--splits", type=int, default=0, help="the grid's split count (default: the engine's, S)")
    args = ap.parse_args()
    g = gpu()
    rng = np.random.default_rng(0)
    T, depth = args.rows, args.depth
    for name in args.shapes:
        c = chunk_inputs(g, rng, name, T, depth)
        out = g.empty((T, c["nh"] * c["D"]), np.float32)
        hpb = args.hpb or c["hpb"]
        S = args.splits or c["S"]
        cnt = g.to_device(np.zeros(T * c["nh"], np.int32)) if hpb != c["hpb"] else c["cnt"]

        def one():
            ATT.attention(g, c["q"], c["kc"], c["vc"], out, c["part_o"], c["part_ml"], c["pos"], None, c["bt"],
                          c["max_blocks"], n_tokens=T, n_kv=c["nkv"], n_gqa=c["G"], head_dim=c["D"], window=0,
                          scale=1 / math.sqrt(c["D"]), n_splits=S, counters=cnt, hpb=hpb)

        keys = int(sum(p + 1 for p in range(depth, depth + T)))
        rec = {"shape": name, "rows": T, "depth": depth, "splits": S, "hpb": hpb, "keys": keys,
               "gflop": round(4.0 * keys * c["nh"] * c["D"] * 1e-9, 3)}
        if args.once:
            one()
            g.sync()
        else:
            us = graph_us(g, one)
            rec.update(us=round(us, 1), tflops=round(rec["gflop"] / us * 1e3, 2))   # GFLOP / us = 1e3 TFLOP/s
        print(json.dumps(rec), flush=True)


if __name__ == "__main__":
    main()
