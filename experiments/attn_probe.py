"""Where does decode attention's time go at short contexts? Times attn_decode alone (a
graph of 20 launches, PDL as in the engine) for model head shapes x contexts x variants.

Run on the device: python3 experiments/attn_probe.py > $OUT/attn_probe.jsonl
"""
import json
import math
import sys

import numpy as np

from memra.gpu.cuda import gpu
from memra.gpu.ops import attention as ATT
from memra.gpu.q8 import Q8_SCALE

SHAPES = {  # name: (head_dim, n_gqa, n_kv)
    "llama3-8b": (128, 4, 8), "llama-1b": (64, 4, 8), "smollm2": (64, 3, 3), "gemma3": (256, 4, 1)}
CTX = (1, 64, 128, 256, 512, 4096)
VARIANTS = [  # (label, defines override, heads per block (None: the rule), q8 twin)
    ("base", {}, None, True),
    ("hpb1", {}, 1, True),
    ("hpb2", {}, 2, True),
    ("hpbG", {}, "G", True),
    ("chunk64", {"ATT_MIN_CHUNK": 64}, None, True),
    ("chunk256", {"ATT_MIN_CHUNK": 256}, None, True),
]


def main():
    g = gpu()
    rng = np.random.default_rng(0)
    n_ctx = 4096
    only = sys.argv[1:] or list(SHAPES)
    for name in only:
        D, G, nkv = SHAPES[name]
        nh = nkv * G
        hpb0 = ATT.heads_per_block(nkv, G)
        # the paged pool (blocks of 16 positions) with the identity block table
        nblk = n_ctx // 16
        kc = g.to_device((rng.standard_normal((nblk, 16, nkv * D)) * 0.5).astype(np.float16).view(np.uint16))
        vc = g.to_device(rng.standard_normal((nblk, 16, nkv * D)).astype(np.float16).view(np.uint16))
        bt = g.to_device(np.arange(nblk, dtype=np.int32)[None, :])
        q = g.to_device(rng.standard_normal((1, nh * D)).astype(np.float32))
        out = g.empty((1, nh * D), np.float32)
        xq, xs = g.empty(nh * D, np.int8), g.empty(nh * D // 32, Q8_SCALE)
        cnt = g.to_device(np.zeros(nh, np.int32))
        for ctx in CTX:
            pos = g.to_device(np.array([ctx - 1], np.int32))
            for label, over, hpb, q8 in VARIANTS:
                hpb = G if hpb == "G" else (hpb or hpb0)
                S = ATT.default_splits(nh // hpb, g.info.sm_count)
                po, pml = ATT.scratch_shapes(1, nh, S, D)
                part_o, part_ml = g.empty(po, np.float32), g.empty(pml, np.float32)
                try:
                    def one():
                        ATT.attention(g, q, kc, vc, out, part_o, part_ml, pos, None, bt, nblk, n_tokens=1,
                                      n_kv=nkv, n_gqa=G, head_dim=D, window=0, scale=1 / math.sqrt(D), n_splits=S,
                                      counters=cnt, xq=xq if q8 else None, xs=xs if q8 else None, pdl=True, hpb=hpb,
                                      config=over)
                    one()
                    g.sync()
                    with g.capture() as gr:
                        for _ in range(20):
                            one()
                    gr.upload()
                    ms = g.time_ms(gr.launch, reps=20, warmup=5)
                    us = float(np.median(ms)) * 1e3 / 20
                    gr.close()
                    rec = {"shape": name, "ctx": ctx, "variant": label, "hpb": hpb, "splits": S, "us": round(us, 2)}
                except Exception as ex:  # a variant that cannot run
                    rec = {"shape": name, "ctx": ctx, "variant": label, "error": str(ex)[:200]}
                print(json.dumps(rec), flush=True)


if __name__ == "__main__":
    main()
