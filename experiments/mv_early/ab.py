#!/usr/bin/env python3
"""Run a memra command with the decode matvec taken from experiments/mv_early/build/matvec.cu (make.py: kernels/
matvec.cu with MV_EARLY, default 1 = its code), kernels/ untouched (experiments/engine_arm.py). The arms differ
by table (tables.py: which entries get MV_EARLY 0), so the shipped table through this runner is the control arm.
Bench receipts carry {"matvec": "mv_early"} in their seams (off the boards).

    python3 experiments/mv_early/ab.py bench synth:llama3-8b:Q4_K_M -p 0 -n 128 -r 3 --tune-table T --out X.jsonl
"""
from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

import engine_arm  # noqa: E402
import make  # noqa: E402

make.generate()
engine_arm.run("matvec.cu", make.ARM_FILE, {}, {"matvec": "mv_early"}, sys.argv[1:])
