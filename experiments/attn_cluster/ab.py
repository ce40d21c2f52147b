#!/usr/bin/env python3
"""Run a memra command with attention.cu's modules from experiments/attn_cluster/build/attention.cu (ATT_CLUSTER 1)
and its attn_decode_rope launched as clusters of (1, splits, 1) blocks (experiments/engine_arm.py plus the launch
below; kernels/ untouched). Set MEMRA_ATT_SPLITS to 16 or less (a cluster holds every split of a head block; the
runner's trimmed grids are powers of two up to it): the control arm is the same command through kernels/ at the same
MEMRA_ATT_SPLITS (the same bits: the merge's operations and order are decode_body's). Bench receipts carry
{"attention": "attn_cluster"} in their seams.

    MEMRA_ATT_SPLITS=16 python3 experiments/attn_cluster/ab.py bench smollm2-135m -d 4096 -p 0 -n 128 -r 3
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

import engine_arm  # noqa: E402
import probe  # noqa: E402

splits = int(os.environ.get("MEMRA_ATT_SPLITS", "0") or 0)
if not 1 <= splits <= 16:
    raise SystemExit(f"attn_cluster/ab.py: set MEMRA_ATT_SPLITS to 1..16 (a cluster holds a head block's splits), "
                     f"got {splits or 'none'}")
probe.generate()

from memra.gpu import cuda  # noqa: E402

_launch, _allowed = cuda.Gpu.launch, set()


def launch(self, kernel, grid, block, args, shmem: int = 0, pdl: bool = False) -> None:
    if probe.is_cluster_launch(kernel, grid):
        return probe.cluster_launch(self, kernel, grid, block, args, shmem, _allowed, pdl)
    return _launch(self, kernel, grid, block, args, shmem, pdl)


cuda.Gpu.launch = launch
engine_arm.run("attention.cu", probe.ARM_FILE, {"ATT_CLUSTER": 1}, {"attention": "attn_cluster"}, sys.argv[1:])
