"""The decode attention at depth, alone: memra's attn_decode (attn_decode_rope, as the engine
launches it) through its tune case (memra.gpu.ops.attention._TuneCase: one token a sequence at
position ctx - 1, the paged KV pools, RoPE and the append inside), timed as the tune harness
times it (graph of L2-cold copies). Why (research/2026-12-02-session16, section 3): at 4096 keys
the 8B's attention takes ~29 µs a layer at ~580 GB/s of KV bytes, and 9, 33 or 128 splits change
nothing, so the bound is inside a block's loop; this probe sweeps the tunables and the split
count at several depths and, with --ncu-one, launches one case a few times for ncu.

    python3 experiments/attn_depth/probe.py --out $OUT/attn-depth.jsonl          # the sweep
    ncu ... python3 experiments/attn_depth/probe.py --ncu-one 4096:8:64:1:9        # ctx:warps:tile:hpb:splits
"""
from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

# (name, n_head, n_head_kv, head_dim): the 8B / 1B (32 x 8 x 128 / 32 x 8 x 64) and SmolLM2 (9 x 3 x 64)
SHAPES = (("8B", 32, 8, 128), ("1B", 32, 8, 64), ("SmolLM2", 9, 3, 64))
CTXS = (1024, 4096, 16384)


def case(g, name, nh, nkv, D, ctx, warps, tile, hpb, splits, rng, rotate):
    from memra.gpu.ops import attention as ATT

    c = ATT._TuneCase(g, {"ATT_WARPS": warps, "ATT_TILE": tile, "hpb": hpb}, nh, nkv, D, ctx, 1, rng, rotate)
    if splits:
        c.S = splits
        po, pml = ATT.scratch_shapes(1, nh, splits, D)
        c.part_o, c.part_ml = g.empty(po, np.float32), g.empty(pml, np.float32)
    return c


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="attn-depth.jsonl")
    ap.add_argument("--ncu-one", default="", help="ctx:warps:tile:hpb:splits of the 8B shape, launched 4 times")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--arm", default="", help="DIR:NAME=V[,NAME=V]: attention.cu from experiments/DIR's build copy (its make.py), "
                    "each NAME=V added to every module (attn_merge:ATT_MERGE_MJ=16, attn_tc:ATT_TC=1; the control of "
                    "either at 0 is kernels/' SASS); default kernels/attention.cu")
    ap.add_argument("--cases", default="", help="name:ctx:warps:tile:hpb:splits,... instead of the sweep "
                    "(name one of SHAPES; splits 0: the engine's default for that hpb)")
    args = ap.parse_args()
    from memra.gpu import cuda
    from memra.gpu.ops import attention as ATT

    arm = {}
    if args.arm:
        where, _, defines = args.arm.partition(":")
        arm = {name: int(value) for name, _, value in (d.partition("=") for d in defines.split(","))}
        sys.path.insert(0, str(ROOT / "experiments"))
        sys.path.insert(0, str(ROOT / "experiments" / where))
        import make
        from engine_arm import route

        make.generate()
        route("attention.cu", make.ARM_FILE, arm)
    import hashlib

    import memra.gpu.compare as CMP

    seen = []
    plain = CMP.compare

    def hashed(name, o, ref, tol):   # the check's output bits, compared across arms (same seed, same order)
        seen.append(hashlib.sha1(np.ascontiguousarray(o).tobytes()).hexdigest()[:16])
        return plain(name, o, ref, tol)

    CMP.compare = hashed
    g = cuda.gpu()
    rng = np.random.default_rng(7)
    rotate = 2 * int(g.info.l2_bytes)
    if args.ncu_one:
        ctx, warps, tile, hpb, splits = (int(v) for v in args.ncu_one.split(":"))
        c = case(g, "8B", 32, 8, 128, ctx, warps, tile, hpb, splits, rng, 0)
        for _ in range(4):
            c.launch(0)
        g.sync()
        print(f"launched 4 x ctx {ctx} warps {warps} tile {tile} hpb {hpb} splits {c.S}")
        return 0
    out = open(args.out, "a")
    t0 = time.perf_counter()
    shapes = {s[0]: s for s in SHAPES}
    if args.cases:
        todo = []
        for spec in args.cases.split(","):
            name, *v = spec.split(":")
            ctx, warps, tile, hpb, splits = (int(x) for x in v)
            _, nh, nkv, D = shapes[name]
            todo.append((shapes[name], ctx, warps, tile, hpb, splits or ATT.default_splits(nh // hpb, g.info.sm_count)))
    else:
        todo = [((name, nh, nkv, D), ctx, warps, tile, hpb, splits)
                for (name, nh, nkv, D), ctx in itertools.product(SHAPES, CTXS)
                for warps, tile, hpb in ((8, 64, 1), (4, 64, 1), (8, 32, 1), (8, 64, nh // nkv))
                for splits in sorted({ATT.default_splits(nh, g.info.sm_count), 64})]
    for (name, nh, nkv, D), ctx, warps, tile, hpb, splits in todo:
        c = case(g, name, nh, nkv, D, ctx, warps, tile, hpb, splits, rng, rotate)
        ok, err, detail = c.check()
        n = max(24, c.sets) // c.sets * c.sets
        with g.capture() as graph:
            for i in range(n):
                c.launch(i % c.sets)
        graph.upload()
        ms = g.time_ms(graph.launch, reps=args.reps, warmup=3)
        graph.close()
        us = float(np.median(ms)) * 1e3 / n
        kv = 2 * ctx * nkv * D * 2
        rec = {"shape": name, "n_head": nh, "n_head_kv": nkv, "head_dim": D, "ctx": ctx, "ATT_WARPS": warps,
               "ATT_TILE": tile, "hpb": hpb, "splits": c.S, "ok": bool(ok), "max_err": err, "us": us,
               "kv_gbps": kv / us / 1e3, "device": g.info.name, "out_sha": seen[-1] if seen else None,
               "arm": args.arm or None, **arm}
        out.write(json.dumps(rec) + "\n")
        out.flush()
        print(f"{name:8s} ctx {ctx:6d} w{warps} t{tile} hpb{hpb} S{c.S:4d} {'ok ' if ok else 'BAD'} "
              f"{us:9.2f} us {kv / us / 1e3:7.0f} GB/s {args.arm} {seen[-1] if seen else ''}", flush=True)
    print(f"-- done at {time.perf_counter() - t0:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
