"""The landing candidate on a GPU: experiments/tile_land/gemm_tile.cu through ops_gemm_tile.py (the
launcher and kernel-check family it will have in memra/gpu/ops/gemm_tile.py), its checks and canary,
then the 8B's shapes timed against memra's gemm (kernels/gemm.cu with the H200 table's entry).

    source .whl/setup.sh && python3 experiments/tile_land/check.py --out $OUT/tile-land.jsonl

memra compiles kernels/<file> only: ab.sh copies gemm_tile.cu into the device copy's kernels/ first
(the device's working tree is thrown away after the call; nothing under kernels/ changes here).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path[:0] = [str(ROOT), str(HERE), str(ROOT / "experiments" / "gemm_tile")]

# (name, type, rows, K, glu): the 8B's prefill GEMMs of each tile type
SHAPES = (("Q4_K gate+up", 12, 28672, 4096, True), ("Q4_K qkv", 12, 6144, 4096, False),
          ("Q4_K o", 12, 4096, 4096, False), ("Q6_K down", 14, 4096, 14336, False),
          ("Q4_0 gate+up", 2, 28672, 4096, True), ("Q8_0 gate+up", 8, 28672, 4096, True))
NBS = (64, 512)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="tile-land.jsonl")
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args()
    from memra.gpu import cuda
    from memra.gpu.ops import gemm as GEMM
    from memra.gpu.ops import matvec as MV
    from memra.gpu.q8 import Q8_SCALE
    import ops_gemm_tile as GT
    import tile as T

    g = cuda.gpu()
    out = open(args.out, "a")
    rng = np.random.default_rng(16)
    t0 = time.perf_counter()
    fails = 0
    for o in list(GT.checks(g, rng)) + [("canary", c) for c in GT.canaries(g, rng)]:
        canary = isinstance(o, tuple)
        o = o[1] if canary else o
        ok = (not o.ok) if canary else o.ok
        fails += not ok
        print(f"{'PASS' if ok else 'FAIL'}  {'canary ' if canary else ''}{o.name}: {o.detail}", flush=True)
        out.write(json.dumps({"kind": "check", "name": o.name, "canary": canary, "ok": bool(ok), "err": o.err}) + "\n")
    print(f"checks done at {time.perf_counter() - t0:.1f} s", flush=True)
    table = json.loads((ROOT / "tune" / "defaults" / "nvidia-h200.json").read_text())["entries"]
    for name, t, rows, K, glu in SHAPES:
        raw = MV.random_weight(t, rows, K, rng)
        w0 = MV.upload_weight(g, raw, t)
        sets = max(2, -(-3 * int(g.info.l2_bytes) // w0.nbytes))
        ws = [w0] + [MV.upload_weight(g, raw, t) for _ in range(sets - 1)]
        N = rows // 2 if glu else rows
        for nb in NBS:
            x = rng.standard_normal((nb, K)).astype(np.float32)
            xq, xs = g.empty((nb, K), np.int8), g.empty((nb, K // 32), Q8_SCALE)
            MV.quantize_q8(g, g.to_device(x), xq, xs, nb)
            y = g.empty((nb, N), np.float32)
            act = "silu" if glu else None
            key = f"cols={K},rows={rows},type={MV.TYPES[t][0]}"
            e = table.get("gemm_glu" if glu else "gemm", {}).get(key, {})
            ent = e.get(str(nb)) or e.get(str(max(int(b) for b in e))) if e else None
            mcfg = ent["config"] if ent else None
            for impl, fn in (("tile", lambda i: GT.gemm_tile(g, ws[i], y, xq=xq, xs=xs, nb=nb, glu=act)),
                             ("memra gemm", lambda i: GEMM.gemm(g, ws[i], y, xq=xq, xs=xs, nb=nb, glu=act, config=mcfg))):
                us = T.time_us(g, [lambda i=i: fn(i) for i in range(sets)], args.reps)
                tops = 2 * N * (2 if glu else 1) * K * nb / us / 1e6
                print(f"time  {name:14s} nb={nb:4d} {impl:11s} {us:9.1f} us {tops:7.1f} TOPS", flush=True)
                out.write(json.dumps({"kind": "time", "shape": name, "type": MV.TYPES[t][0], "rows": rows, "K": K,
                                      "glu": glu, "nb": nb, "impl": impl, "us": us, "tops": tops,
                                      "config": mcfg if impl != "tile" else GT.launch_config(t, nb)}) + "\n")
        ws.clear()
    print(f"\n{'passed' if not fails else f'{fails} FAILED'} in {time.perf_counter() - t0:.1f} s")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
