#!/usr/bin/env python3
"""Occupancy and waves of the shipped table's batch-1 matvec entries on the H200 (132 SMs, 64 K registers and 64
warps an SM, 32 blocks an SM), from each module's register count (cubin_regs.py; CPU only): blocks an SM by
registers (256-register allocation units a warp), resident blocks, the grid (matvec.cu: ceil(N / (ROWS x NWARPS
/ KSPLIT))), waves = grid / resident, and units a lane (K / 64 / 32 per row). Where the step's matvecs stand
before an engine A/B picks among their configurations.

    python3 experiments/engine_tune/occupancy.py [SHAPE_REGEX]      # e.g. 'cols=(4096|14336),.*'
"""
from __future__ import annotations

import json
import math
import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import mv_tables  # noqa: E402
from cubin_regs import kernel_regs  # noqa: E402
from memra.gpu.compile import compile_cubin  # noqa: E402
from memra.gpu.ops import matvec as M  # noqa: E402

SMS, REGS, WARPS, BLOCKS = 132, 65536, 64, 32


def blocks_per_sm(regs: int, nwarps: int) -> int:
    per_warp = math.ceil(regs * 32 / 256) * 256
    by_regs = (REGS // per_warp) // nwarps
    return max(0, min(by_regs, WARPS // nwarps, BLOCKS))


def main(rx: str = ".*") -> None:
    t = json.loads(mv_tables.SHIPPED.read_text())
    print(f"{'kernel':10s} {'shape':34s} {'config':52s} regs  blk/SM  grid   waves  units/lane")
    for kernel in ("matvec", "matvec_glu"):
        for key, buckets in sorted(t["entries"][kernel].items()):
            e = buckets.get("1")
            if not e or not re.fullmatch(rx, key):
                continue
            s = mv_tables.shape(key)
            tid, glu = M.type_id(s["type"]), kernel == "matvec_glu"
            N, K = s["rows"] // (2 if glu else 1), s["cols"]
            cfg = M.launch_config(tid, True, N, K, 1, glu, None, lambda _n: e["config"])
            regs = kernel_regs(compile_cubin("matvec.cu", "sm_90a", M.module_defines(tid, 1, cfg)))["mv_q8_glu" if glu else "mv_q8"]
            b = blocks_per_sm(regs, cfg["MV_NWARPS"])
            grid = M.grid_for(N, cfg)
            print(f"{kernel:10s} {key:34s} {json.dumps(cfg, sort_keys=True)[:52]:52s} {regs:4d}  {b:6d}  {grid:5d}  "
                  f"{grid / (b * SMS):5.2f}  {K / 64 / 32 / cfg.get('MV_KSPLIT', 1):5.1f}")


if __name__ == "__main__":
    main(*sys.argv[1:2])
