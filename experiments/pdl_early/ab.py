#!/usr/bin/env python3
"""Run a memra command with every kernel module compiled from experiments/pdl_early's copy of kernels/ for one arm
(make.py: base, q8, nq, early; kernels/ untouched). Bench receipts carry {"pdl": ARM} in their seams.

    PDL_ARM=early python3 experiments/pdl_early/ab.py bench synth:smollm2-135m:Q4_1 -p 0 -n 128 -r 3

`memra warmup`'s compile workers (spawned: they import this file as __mp_main__) take the redirect, not the build.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))
sys.path.insert(0, str(HERE))

import make  # noqa: E402

FOLDER = HERE / "build" / "kernels"
ARM = os.environ.get("PDL_ARM", "")
if __name__ == "__main__":
    if ARM not in make.ARMS:
        raise SystemExit(f"pdl_early/ab.py: set PDL_ARM to one of {', '.join(make.ARMS)}")
    make.make(ARM, FOLDER)

import memra.gpu.compile as C  # noqa: E402

C.kernel_dir = lambda: FOLDER

if __name__ == "__main__":
    from memra.tune import bench as TB

    base = TB.seams
    TB.seams = lambda: {**base(), "pdl": ARM}

    from memra.cli import app

    app(prog_name="memra", args=sys.argv[1:])
