"""One chain_mv configuration and memra's mv_q8 on one Q4_K shape, each launched 4 times, for ncu
(why the chain matvec runs at 0.8-0.9x mv_q8 at batch 1: research/2026-12-02-session16/z/).

    ncu --clock-control none -k regex:"chain_mv|mv_q8" --launch-skip 2 --launch-count 2 ... \\
        python3 experiments/chain_mv/prof.py --config nw8 --shape 4096x4096

(launches: chain_mv x 4, then mv_q8 x 4: with --launch-skip 2 --launch-count 1 per kernel name
filter, or the prof.sh beside this file)."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parents[1]), str(HERE.parent / "gemm_tile")]
import run as R  # noqa: E402  (chain_mv's host code: CONFIGS, launch_shape, compile_module, table_config)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", default="nw8")
    ap.add_argument("--shape", default="4096x4096")
    args = ap.parse_args()
    from memra.gpu.cuda import Module, gpu
    from memra.gpu.ops import matvec as MV
    from memra.gpu.q8 import Q8_SCALE

    defs = dict(R.CONFIGS)[args.config]
    rows, K = (int(v) for v in args.shape.split("x"))
    g = gpu(0)
    cub, _ = R.compile_module(defs)
    mod = Module(g, "chain_mv.cu", dict(defs), cub)
    rng = np.random.default_rng(1)
    raw = MV.random_weight(R.Q4_K, rows, K, rng)
    w = MV.upload_weight(g, raw, R.Q4_K)
    x = rng.standard_normal((1, K)).astype(np.float32)
    xq, xs = g.empty((1, K), np.int8), g.empty((1, K // 32), Q8_SCALE)
    MV.quantize_q8(g, g.to_device(x), xq, xs, 1)
    y = g.empty((8, rows), np.float32)
    grid, block, shmem = R.launch_shape(defs, rows, int(g.info.sm_count), None)
    k = mod.kernel("chain_mv")
    for _ in range(4):
        g.launch(k, grid, block, (w.bulk, w.meta, xq, xs, y, np.int32(rows), np.int32(K), np.int32(1)), shmem=shmem)
    cfg = R.table_config("matvec", rows, K)
    for _ in range(4):
        MV.matvec(g, w, y, xq=xq, xs=xs, nb=1, config=cfg)
    g.sync()
    print(f"chain_mv {args.config} grid {grid} block {block} smem {shmem}; mv_q8 {cfg}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
