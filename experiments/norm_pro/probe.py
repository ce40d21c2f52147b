#!/usr/bin/env python3
"""The RMSNorm moved into the matvec's prologue (make.py's mv_q8n), alone on the device: for the decode step's
norm -> matvec pairs of the three benchmark shapes, (1) the bits: mv_q8n's output against rmsnorm (NORM_THREADS T,
its q8 twin) + mv_q8 at the same configuration, which must be equal bit for bit; (2) the time: a graph of PDL
launches, the pair (rmsnorm + mv_q8) repeated against mv_q8n repeated, weights rotated past the L2 as the tune
harness rotates them. The matvec's configuration is the table's q8 entry for the shape (else the built-in one).

    python3 experiments/norm_pro/probe.py --out $OUT/norm-pro.jsonl
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))

# (name, ggml type, output rows (GLU: gate + up), K, glu, norm): the norm -> matvec pairs of a decode step, and
# (norm False) the quantize -> down pairs
SHAPES = (
    ("SmolLM2 qkv", 3, 960, 576, False, True), ("SmolLM2 gate_up", 3, 3072, 576, True, True),
    ("1B qkv", 2, 3072, 2048, False, True), ("1B gate_up", 2, 16384, 2048, True, True),
    ("8B qkv", 12, 6144, 4096, False, True), ("8B gate_up", 12, 28672, 4096, True, True),
    ("SmolLM2 down", 3, 576, 1536, False, False), ("1B down", 2, 2048, 8192, False, False),
    ("8B down", 14, 4096, 14336, False, False),
)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="norm-pro.jsonl")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--nb", default="1", help="comma-separated batch rows")
    args = ap.parse_args()
    import make
    from memra.gpu import cuda
    from memra.gpu.ops import matvec as MV
    from memra.gpu.ops import norm as NORM
    from memra.gpu.q8 import Q8_SCALE
    from memra.tune import tables as TABLES

    make.generate()
    g = cuda.gpu()
    table, _ = TABLES.load_table(g.info.name, g.info.cc, sms=g.info.sm_count)
    rng = np.random.default_rng(11)
    rotate = 2 * int(g.info.l2_bytes)
    out = open(args.out, "a")
    for name, t, rows, K, glu, norm in SHAPES:
        for nb in (int(v) for v in args.nb.split(",")):
            N = rows // 2 if glu else rows
            choice = TABLES.lookup(table, "matvec_glu" if glu else "matvec", {"cols": K, "rows": rows, "type": MV.TYPES[t][0]}, nb)
            cfg = MV.launch_config(t, True, N, K, nb, glu, dict(choice.config) if choice and choice.variant == "q8"
                                   else None)
            ncfg = TABLES.lookup(table, "rmsnorm", {"n": K}, 1)   # the plan looks the norms up at batch 1
            T = NORM.launch_config(K, True, dict(ncfg.config) if ncfg else None)[0] if norm else 32
            ws, _ = MV._shape_weights(g, t, rows, K, rng, rotate)
            x = g.to_device((rng.standard_normal((nb, K)) * 3).astype(np.float32))
            w = g.to_device((1 + 0.1 * rng.standard_normal(K)).astype(np.float32))
            h = g.empty((nb, K), np.float32)
            xq, xs = g.empty((nb, K), np.int8), g.empty((nb, K // 32), Q8_SCALE)
            ya, yb = g.empty((nb, N), np.float32), g.empty((nb, N), np.float32)
            act = "silu" if glu else None
            kn = g.module(make.ARM_FILE, {**MV.module_defines(t, nb, cfg), "MV_NORM": T}).kernel(
                "mv_q8n_glu" if glu else "mv_q8n")
            shmem = MV.prologue_smem_bytes(nb, K, T)
            eps = np.float32(1e-5)

            qcfg = TABLES.lookup(table, "quantize_q8", {"n": K}, nb)

            def pair(i, pdl=True):
                if norm:
                    NORM.rmsnorm(g, x, w, h, K, float(eps), rows=nb, xq=xq, xs=xs, pdl=pdl,
                                 config={"NORM_THREADS": T})
                else:
                    MV.quantize_q8(g, x, xq, xs, nb, config=dict(qcfg.config) if qcfg else None, pdl=pdl)
                MV.matvec(g, ws[i % len(ws)], ya, xq=xq, xs=xs, nb=nb, glu=act, config=cfg, pdl=pdl)

            def fused(i, pdl=True):
                wt = ws[i % len(ws)]
                g.launch(kn, (MV.grid_for(N, cfg),), (32 * cfg["MV_NWARPS"],),
                         (wt.bulk, wt.meta, x, w if norm else np.uint64(0), eps, yb, np.uint64(0), np.int32(N),
                          np.int32(K), np.int32(nb), np.int32(MV.ACTS[act])), shmem=shmem, pdl=pdl)

            ya.poison(), yb.poison()
            pair(0, False)
            fused(0, False)
            g.sync()
            a, b = ya.numpy(), yb.numpy()
            same = bool(np.array_equal(a.view(np.uint32), b.view(np.uint32)))
            diff = int(np.count_nonzero(a.view(np.uint32) != b.view(np.uint32)))
            rec = {"shape": name, "type": MV.TYPES[t][0], "rows": rows, "K": K, "glu": glu, "norm": norm, "nb": nb,
                   "NORM_THREADS": T, "config": cfg, "bit_identical": same, "outputs_differing": diff,
                   "device": g.info.name}
            n = max(24, len(ws)) // len(ws) * len(ws)
            for arm, fn in (("pair", pair), ("fused", fused), ("pair", pair), ("fused", fused)):
                with g.capture() as graph:
                    for i in range(n):
                        fn(i)
                graph.upload()
                ms = g.time_ms(graph.launch, reps=args.reps, warmup=3)
                graph.close()
                rec.setdefault(arm + "_us", []).append(float(np.median(ms)) * 1e3 / n)
            out.write(json.dumps(rec) + "\n")
            out.flush()
            print(f"{name:16s} nb {nb} T {T} {'SAME' if same else f'DIFFER ({diff})'}  pair "
                  f"{min(rec['pair_us']):7.2f} us  fused {min(rec['fused_us']):7.2f} us  {cfg}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
