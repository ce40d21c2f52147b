"""attn_decode with ATT_ROWS token rows a block (experiments/attn_rows/make.py) against
kernels/attention.cu's attn_decode over a prefill chunk: the same bits (out and its q8 twin),
and how fast. On the H200:

    python3 experiments/attn_rows/check.py [smollm2 llama-1b llama3-8b] [--rows 512] [--depth 0,4096]
        [--R 2,4,8,16]

A chunk as the prefill step launches it (experiments/attn_prefill_probe.py: T rows of one sequence
at positions depth .. depth + T - 1, the whole GQA group a block, the default split count, the q8
twin when the head dimension allows it). One JSON line per (shape, depth, R): us of the kernel and
of the reference (graphs of 10 launches, medians), exact (out and twin bit for bit). Exit 1 on any
difference.
"""
from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np

from memra.gpu.cuda import gpu
from memra.gpu.ops import attention as ATT
from memra.gpu.q8 import Q8_SCALE

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
from attn_prefill_probe import KV_BLOCK, chunk_inputs, graph_us  # noqa: E402  (the same chunk as the probe's)
SRC = "../experiments/attn_rows/build/attention.cu"   # relative to kernels/ (memra's kernel_dir)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("shapes", nargs="*", default=["smollm2", "llama-1b", "llama3-8b"])
    ap.add_argument("--rows", type=int, default=512)
    ap.add_argument("--depth", default="0,4096")
    ap.add_argument("--R", default="2,4,8,16")
    args = ap.parse_args()
    subprocess.run([sys.executable, str(HERE / "make.py"), str(HERE / "build" / "attention.cu")], check=True,
                   stdout=subprocess.DEVNULL)
    g = gpu()
    rng = np.random.default_rng(0)
    T, bad = args.rows, 0
    for depth in (int(x) for x in args.depth.split(",")):
        for name in args.shapes:
            c = chunk_inputs(g, rng, name, T, depth)
            D, G, nkv, nh, S, hpb = c["D"], c["G"], c["nkv"], c["nh"], c["S"], c["hpb"]
            q, kc, vc, bt, pos, cnt = c["q"], c["kc"], c["vc"], c["bt"], c["pos"], c["cnt"]
            part_o, part_ml, max_blocks = c["part_o"], c["part_ml"], c["max_blocks"]
            nhb = nh // hpb
            twin = D % 32 == 0
            outs = {k: g.empty((T, nh * D), np.float32) for k in ("ref", "var")}
            xqs = {k: g.empty(T * nh * D, np.int8) for k in ("ref", "var")}
            xss = {k: g.empty(T * nh * D // 32, Q8_SCALE) for k in ("ref", "var")}
            scale = 1 / math.sqrt(D)

            def ref():
                ATT.attention(g, q, kc, vc, outs["ref"], part_o, part_ml, pos, None, bt, max_blocks, n_tokens=T,
                              n_kv=nkv, n_gqa=G, head_dim=D, window=0, scale=scale, n_splits=S, counters=cnt,
                              xq=xqs["ref"] if twin else None, xs=xss["ref"] if twin else None, hpb=hpb)

            ref_us = graph_us(g, ref)
            a = outs["ref"].numpy().view(np.uint32).copy()
            aq = xqs["ref"].numpy().copy() if twin else None
            for R in (int(x) for x in args.R.split(",")):
                if T % R:
                    continue
                d = {"HEAD_DIM": D, "N_GQA": hpb, **ATT.defines(D, None), "KV_BLOCK": KV_BLOCK, "ATT_ROWS": R}
                k = g.module(SRC, d).kernel("attn_decode")
                nt = 32 * d["ATT_WARPS"]

                def var(k=k, R=R):
                    g.launch(k, (nhb, S, T // R), (nt,),
                             (q, kc, vc, part_o, part_ml, cnt, outs["var"],
                              xqs["var"] if twin else np.uint64(0), xss["var"] if twin else np.uint64(0), pos,
                              np.uint64(0), bt, np.int32(max_blocks), np.int32(nkv), np.int32(G), np.int32(0),
                              np.float32(scale), np.float32(0.0)))

                outs["var"].fill_bytes(0xFF)
                us = graph_us(g, var)
                b = outs["var"].numpy().view(np.uint32)
                exact = bool(np.array_equal(a, b)) and (not twin or bool(np.array_equal(aq, xqs["var"].numpy())))
                bad += not exact
                print(json.dumps({"shape": name, "rows": T, "depth": depth, "splits": S, "R": R, "us": round(us, 1),
                                  "ref_us": round(ref_us, 1), "speedup": round(ref_us / us, 3), "exact": exact}),
                      flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
