"""Launch each GEMM of interest exactly once (after one warm-up outside the profiled range) so
that `ncu` (experiments/gemm_tile/prof.sh) can read its counters: where do the warps of the tile
prototype and of kernels/gemm.cu stall?

    ncu ... python3 experiments/gemm_tile/prof.py

Kernels (Q4_K, the 8B's gate+up 2 x 14336 x 4096, synthetic weights):
  gemm_tile_glu "2,4,3 tcm" and "2,4,3" at 512 rows, kernels/gemm.cu's gemm_q8_glu with the H200
  table's configuration (2,2,2,4,1,3,1,1 with GM_MINB 1) at 512 and 64 rows.
The profiled launches are the second of each (cuProfilerStart / Stop around them; prof.sh passes
--profile-from-start off).

    python3 experiments/gemm_tile/prof.py --ablate      # no ncu: CUDA-event medians

times "2,4,3 tcm" at 512 rows with gemm_tile.cu's GT_ABL ablations (1: no weight staging in the K
loop, 2: no float formula, 4: no activation copies, and their sums; wrong results, timing only),
beside the full kernel and kernels/gemm.cu with the table's configuration.
"""
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parents[1]))

import tile  # noqa: E402

TABLE_CFG = {"GM_WM": 2, "GM_WN": 2, "GM_TM": 2, "GM_TN": 4, "GM_WK": 1, "GM_STAGES": 3, "GM_LREG": 1, "GM_MINB": 1}
PROFILED = ("2,4,3 tcm", "2,4,3")


ABLATIONS = (0, 1, 2, 4, 3, 5, 6, 7)


def ablate(args) -> int:
    from memra.gpu.ops import matvec as MV
    from memra.gpu.ops.gemm import gemm
    from memra.gpu.q8 import Q8_SCALE

    base = dict(tile.CONFIGS)["2,4,3 tcm"]
    tile.CONFIGS = tuple((f"tcm abl{a}", {**base, "GT_ABL": a}) for a in ABLATIONS)
    from concurrent.futures import ProcessPoolExecutor
    with ProcessPoolExecutor(8) as ex:   # (ptxas -v prints no entry for an unused kernel of a define set)
        cubins = {n: r for (n, _), r in zip(tile.CONFIGS, ex.map(tile.compile_module, [d for _, d in tile.CONFIGS]))}
    run = tile.Run(cubins)
    g = run.g
    rng = np.random.default_rng(7)
    rows, K = 2 * 14336, 4096
    N = rows // 2
    raw = MV.random_weight(tile.Q4_K, rows, K, rng)
    ws = [MV.upload_weight(g, raw, tile.Q4_K) for _ in range(4)]
    x = tile.make_x(rng, 512, K)
    xq, xs = g.empty((512, K), np.int8), g.empty((512, K // 32), Q8_SCALE)
    MV.quantize_q8(g, g.to_device(x), xq, xs, 512)
    y = g.empty((512, N), np.float32)
    out = []
    for name, _ in tile.CONFIGS:
        us = tile.time_us(g, [lambda i=i, name=name: run.launch_tile(name, ws[i], xq, xs, y, 512, True)
                              for i in range(len(ws))], args.reps)
        out.append((name, 512, us))
    for nb in (512, 64):
        us = tile.time_us(g, [lambda i=i, nb=nb: gemm(g, ws[i], y, xq=xq, xs=xs, nb=nb, glu="silu", config=TABLE_CFG)
                              for i in range(len(ws))], args.reps)
        out.append(("memra table cfg", nb, us))
    for name, nb, us in out:
        print(f"{name:18s} nb={nb:4d} {us:9.1f} us  {2 * rows * K * nb / us / 1e6:7.1f} TOPS", flush=True)
    return 0


def main() -> int:
    from cuda.bindings import driver as drv
    from memra.gpu.ops import matvec as MV
    from memra.gpu.ops.gemm import gemm
    from memra.gpu.q8 import Q8_SCALE

    tile.CONFIGS = tuple((n, d) for n, d in tile.CONFIGS if n in PROFILED)
    cubins = tile.compile_all(2)
    run = tile.Run(cubins)
    g = run.g
    rng = np.random.default_rng(7)
    rows, K = 2 * 14336, 4096
    N = rows // 2
    w = MV.upload_weight(g, MV.random_weight(tile.Q4_K, rows, K, rng), tile.Q4_K)
    x = tile.make_x(rng, 512, K)
    xq, xs = g.empty((512, K), np.int8), g.empty((512, K // 32), Q8_SCALE)
    MV.quantize_q8(g, g.to_device(x), xq, xs, 512)
    y = g.empty((512, N), np.float32)
    launches = [(f"tile {c} 512", lambda c=c: run.launch_tile(c, w, xq, xs, y, 512, True)) for c in PROFILED]
    launches += [(f"memra table cfg {nb}", lambda nb=nb: gemm(g, w, y, xq=xq, xs=xs, nb=nb, glu="silu", config=TABLE_CFG))
                 for nb in (512, 64)]
    for _, f in launches:   # warm-up: module loads, attributes
        f()
    g.sync()
    drv.cuProfilerStart()
    for name, f in launches:
        f()
        g.sync()
        print("profiled", name, flush=True)
    drv.cuProfilerStop()
    return 0


if __name__ == "__main__":
    import argparse
    ap = argparse.ArgumentParser()
    ap.add_argument("--ablate", action="store_true")
    ap.add_argument("--reps", type=int, default=20)
    a = ap.parse_args()
    sys.exit(ablate(a) if a.ablate else main())
