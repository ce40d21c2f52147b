#!/usr/bin/env python3
"""The RMSNorm moved into the matvec's prologue (make.py's mv_q8n), alone on the device: for the decode step's
norm -> matvec pairs of the three benchmark shapes, (1) the bits: mv_q8n's output against rmsnorm (NORM_THREADS T,
its q8 twin) + mv_q8 at the same configuration, which must be equal bit for bit; (2) the time: a graph of PDL
launches, the pair (rmsnorm + mv_q8) repeated against mv_q8n repeated, weights rotated past the L2 as the tune
harness rotates them; and the fused launch with MV_PREFETCH 1 (its first weight unit loaded into registers before
the PDL wait, so the weights' round trip overlaps the prologue's). The matvec's configuration is the table's q8 entry for the shape (else the built-in one).

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
sys.path.insert(0, str(HERE.parent))   # engine_arm
sys.path.insert(0, str(HERE))

# (name, ggml type, output rows (GLU: gate + up), K, glu, mode): the norm -> matvec pairs of a decode step ("norm"),
# Gemma-3's add_rmsnorm (post-norm) -> matvec pairs ("add"), and the quantize -> down pairs ("quant")
SHAPES = (
    ("SmolLM2 qkv", 3, 960, 576, False, "norm"), ("SmolLM2 gate_up", 3, 3072, 576, True, "norm"),
    ("1B qkv", 2, 3072, 2048, False, "norm"), ("1B gate_up", 2, 16384, 2048, True, "norm"),
    ("8B qkv", 12, 6144, 4096, False, "norm"), ("8B gate_up", 12, 28672, 4096, True, "norm"),
    ("Gemma-3 gate_up", 6, 4096, 640, True, "add"), ("Gemma-3 qkv", 6, 1280, 640, False, "add"),
    ("SmolLM2 down", 3, 576, 1536, False, "quant"), ("1B down", 2, 2048, 8192, False, "quant"),
    ("8B down", 14, 4096, 14336, False, "quant"),
)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="norm-pro.jsonl")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--nb", default="1", help="comma-separated batch rows")
    ap.add_argument("--only", default="", help="comma-separated shape names (default: every one)")
    args = ap.parse_args()
    import engine_arm
    import make
    from memra.gpu import cuda
    from memra.gpu.ops import matvec as MV
    from memra.gpu.ops import norm as NORM
    from memra.gpu.q8 import Q8_SCALE
    from memra.tune import tables as TABLES

    make.generate()
    engine_arm.route("matvec.cu", make.ARM_FILE, {})   # every matvec.cu module from the build copy (MV_NORM 0: the same SASS)
    g = cuda.gpu()
    table, _ = TABLES.load_table(g.info.name, g.info.cc, sms=g.info.sm_count)
    rng = np.random.default_rng(11)
    rotate = 2 * int(g.info.l2_bytes)
    out = open(args.out, "a")
    only = {v.strip() for v in args.only.split(",") if v.strip()}
    for name, t, rows, K, glu, mode in (s for s in SHAPES if not only or s[0] in only):
        norm = mode != "quant"
        for nb in (int(v) for v in args.nb.split(",")):
            N = rows // 2 if glu else rows
            choice = TABLES.lookup(table, "matvec_glu" if glu else "matvec", {"cols": K, "rows": rows, "type": MV.TYPES[t][0]}, nb)
            # the table's tunables laid over the built-in ones, as the runner's launches take them
            cfg = MV.launch_config(t, True, N, K, nb, glu, None,
                                   lambda _n: dict(choice.config) if choice and choice.variant == "q8" else None)
            nk = "add_rmsnorm" if mode == "add" else "rmsnorm"
            ncfg = TABLES.lookup(table, nk, {"n": K}, 1)   # the plan looks the norms up at batch 1
            T = NORM.launch_config(K, nk == "rmsnorm", dict(ncfg.config) if ncfg else None)[0] if norm else 32
            ws, _ = MV._shape_weights(g, t, rows, K, rng, rotate)
            x = g.to_device((rng.standard_normal((nb, K)) * 3).astype(np.float32))
            w = g.to_device((1 + 0.1 * rng.standard_normal(K)).astype(np.float32))
            h = g.empty((nb, K), np.float32)
            xq, xs = g.empty((nb, K), np.int8), g.empty((nb, K // 32), Q8_SCALE)
            ya, yb = g.empty((nb, N), np.float32), g.empty((nb, N), np.float32)
            act = "silu" if glu else None
            eps = np.float32(1e-5)
            d = g.to_device(rng.standard_normal((nb, K)).astype(np.float32)) if mode == "add" else None
            wp = g.to_device((1 + 0.1 * rng.standard_normal(K)).astype(np.float32)) if mode == "add" else None
            xa, xb = g.empty((nb, K), np.float32), g.empty((nb, K), np.float32)   # add_rmsnorm's residual, in / out

            qcfg = TABLES.lookup(table, "quantize_q8", {"n": K}, nb)

            def pair(i, pdl=True):
                if mode == "add":   # in place on xa (the engine's x), as add_rmsnorm runs
                    NORM.add_rmsnorm(g, xa, d, w, h, K, float(eps), rows=nb, w_post=wp, xq=xq, xs=xs, pdl=pdl,
                                     config={"NORM_THREADS": T})
                elif norm:
                    NORM.rmsnorm(g, x, w, h, K, float(eps), rows=nb, xq=xq, xs=xs, pdl=pdl,
                                 config={"NORM_THREADS": T})
                else:
                    MV.quantize_q8(g, x, xq, xs, nb, config=dict(qcfg.config) if qcfg else None, pdl=pdl)
                MV.matvec(g, ws[i % len(ws)], ya, xq=xq, xs=xs, nb=nb, glu=act, config=cfg, pdl=pdl)

            def fused(i, pdl=True, c=cfg):
                MV.matvec(g, ws[i % len(ws)], yb, nb=nb, glu=act, config=c, pdl=pdl, prologue=MV.Prologue(
                    x, w if norm else None, float(eps), T, d, wp, x_out=xb if mode == "add" else None))

            def fused_pf(i, pdl=True):   # the first weight unit in registers before the PDL wait, over the prologue
                fused(i, pdl, {**cfg, "MV_PREFETCH": 1})

            ya.poison(), yb.poison()
            g.copy(xa, x)
            pair(0, False)
            fused(0, False)
            g.sync()
            a, b = ya.numpy(), yb.numpy()
            same = bool(np.array_equal(a.view(np.uint32), b.view(np.uint32)))
            diff = int(np.count_nonzero(a.view(np.uint32) != b.view(np.uint32)))
            if mode == "add":   # the residual the fused launch wrote aside equals add_rmsnorm's in place
                diff += int(np.count_nonzero(xa.numpy().view(np.uint32) != xb.numpy().view(np.uint32)))
                same = diff == 0
            rec = {"shape": name, "type": MV.TYPES[t][0], "rows": rows, "K": K, "glu": glu, "mode": mode, "nb": nb,
                   "NORM_THREADS": T, "config": cfg, "bit_identical": same, "outputs_differing": diff,
                   "device": g.info.name}
            n = max(24, len(ws)) // len(ws) * len(ws)
            for arm, fn in (("pair", pair), ("fused", fused), ("fused_pf", fused_pf)) * 2:
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
                  f"{min(rec['pair_us']):7.2f} us  fused {min(rec['fused_us']):7.2f} us  prefetched "
                  f"{min(rec['fused_pf_us']):7.2f} us  {cfg}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
