#!/usr/bin/env python3
"""attn_fa_dsplit: attn_fa's prefill packing with FA_DSPLIT warps sharing each 16-row tile (every one
computes the tile's scores and softmax, each P V for its share of the head's dims, as attn_fa_dec's
warps do), checked bit for bit against the stock kernel and timed beside it (arms alternating).

Why (research/2026-12-03-session25 §4): at the 8B's 512 prompt rows and depth 4096 the stock kernel is
latency-bound at 2 warps a scheduler (32 % issue) and the chunk has only ~7.8 warps of 16-row tiles an
SM; sharing a tile between 2 warps doubles the warps (16 an SM with 2 blocks of 8 warps at <= 128
registers, FA_MINB 2) at the price of the scores and softmax computed twice (~1.6x the instructions).
Predicted: 8B d4096 ~1.2x if the issue rate rises to ~60 %; slower if the spills of the 128-register
cap (72 / 88 bytes a thread at head 128) sit in the tile loop.

    python3 experiments/attn_fa_dsplit/ab.py --compile-only        # here: NVRTC, registers and spills
    python3 experiments/attn_fa_dsplit/ab.py > $OUT/fa-dsplit.jsonl  # device: bits, then timing

Each case: one sequence's 512 (or 128) prompt rows at a depth over a shuffled paged cache
(experiments/attn_mma/fa_check.py's Case), the stock attn_fa (memra.gpu.ops.attn_fa, FA_WARPS 4) and
the variant (FA_WARPS 4 row tiles x FA_DSPLIT warps, the same group table and shared memory, a block
of 32 x 4 x FA_DSPLIT threads) writing `out`; bits compared as uint32; then CUDA-graph timing of 20
launches, median of 10 replays, stock / variant / stock / variant.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "experiments" / "attn_mma"))
SRC = str(HERE / "build" / "attn_fa_dsplit.cu")  # kernels/attn_fa.cu + attn_fa_dsplit.patch (main builds it)
VARIANTS = {  # name: extra defines
    "dsplit2": {"FA_DSPLIT": 2, "FA_QREG": 0, "FA_MINB": 2},
    "dsplit2-qreg": {"FA_DSPLIT": 2, "FA_QREG": 1, "FA_MINB": 1},
}
SHAPES = ("llama3-8b", "llama-1b", "smollm2")


def var_defines(D: int, split: int, extra: dict) -> dict:
    from memra.gpu.ops.attn_fa import defines

    return {**defines(D, split, 16, 0, 4), **extra}


def compile_only(split: int) -> int:
    from memra.gpu.compile import _nvrtc, options_for

    for name, extra in VARIANTS.items():
        for D in (64, 128):
            _, log = _nvrtc(SRC, options_for("sm_90a", var_defines(D, split, extra), ("--ptxas-options=-v",)))
            lines = log.splitlines()
            i = next(k for k, ln in enumerate(lines) if ln.rstrip().endswith("Function properties for attn_fa"))
            print(json.dumps({"variant": name, "head_dim": D, "ptxas": " ".join(x.strip() for x in lines[i + 1:i + 3])}))
    return 0


def launch_variant(g, c, extra: dict, split: int, groups, n_groups: int) -> None:
    from memra.gpu.ops.attn_fa import smem_bytes

    m = g.module(SRC, var_defines(c.D, split, extra))
    d = c.d
    kc = d["k"].view(shape=(c.k16.shape[0], 16, c.n_kv * c.D))
    vc = d["v"].view(shape=(c.k16.shape[0], 16, c.n_kv * c.D))
    qpk = c.n_head // c.n_kv
    g.launch(m.kernel("attn_fa"), (n_groups, c.n_kv, c.n_split), (32 * 4 * extra["FA_DSPLIT"],),
             (d["q"], kc, vc, d["po"], d["pml"], d["out"], d["pos"], d["seq"], d["bt"], np.int32(c.max_blocks),
              groups, np.int32(c.n_kv), np.int32(qpk), np.int32(c.window), np.float32(c.scale), np.float32(0.0)),
             smem_bytes(c.D, False, 4))
    if c.n_split > 1:
        g.launch(m.kernel("fa_combine"), (c.n_head, c.T), (c.D,),
                 (d["po"], d["pml"], d["out"], d["pos"], np.int32(c.window), np.int32(c.n_split)))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--compile-only", action="store_true")
    ap.add_argument("--split", type=int, default=4096)
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--no-timing", action="store_true")
    a = ap.parse_args()
    sys.path.insert(0, str(ROOT / "experiments"))
    from kernel_edit import build_from_patch

    if build_from_patch("attn_fa.cu", HERE / "attn_fa_dsplit.patch", Path(SRC)):
        return 1
    if a.compile_only:
        return compile_only(a.split)
    import fa_check as FC
    from memra.gpu.cuda import gpu
    from memra.gpu.ops.attn_fa import group_table
    from memra.gpu.runner import _pow2_at_most

    FC.FA_SPLIT, FC.FA_WARPS = a.split, 4
    g = gpu()
    rng = np.random.default_rng(0)
    bad = 0
    for name in a.shapes.split(","):
        D, nh, nkv, win = FC.SHAPES[name]
        for depth, T in ((0, 512), (4096, 512), (300, 128), (1000, 128)):
            c = FC.Case(g, rng, D, nh, nkv, win, depth, T)
            tpb = FC.prefill_tpb(c)
            n = len(group_table(c.seq, c.pos, tpb))
            size = _pow2_at_most(n, c.T)
            groups = g.to_device(group_table(c.seq, c.pos, tpb, size=size))
            c.d["out"].fill_bytes(0xFF)
            FC.launch_fa(g, None, c, tpb)
            ref = c.d["out"].numpy().copy()
            for vname in a.variants.split(","):
                extra = VARIANTS[vname]
                c.d["out"].fill_bytes(0xFF)
                launch_variant(g, c, extra, a.split, groups, size)
                same = bool(np.array_equal(c.d["out"].numpy().view(np.uint32), ref.view(np.uint32)))
                bad += not same
                rec = {"kind": "record", "what": "fa-dsplit", "shape": name, "depth": depth, "T": T, "split": a.split,
                       "variant": vname, "defines": extra, "bits_equal_stock": same}
                if T == 512 and same and not a.no_timing:
                    us = {"stock": [], "variant": []}
                    for _ in range(2):
                        us["stock"].append(FC.graph_us(g, lambda: FC.launch_fa(g, None, c, tpb)))
                        us["variant"].append(FC.graph_us(g, lambda: launch_variant(g, c, extra, a.split, groups, size)))
                    rec.update(us_stock=[round(x, 2) for x in us["stock"]], us_variant=[round(x, 2) for x in us["variant"]],
                               speedup_vs_stock=round(min(us["stock"]) / min(us["variant"]), 3))
                print(json.dumps(rec), flush=True)
    print("ALL OK" if not bad else f"{bad} FAILED", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
