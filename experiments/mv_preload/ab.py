#!/usr/bin/env python3
"""Run a memra command with the decode matvec taken from experiments/mv_preload/build/matvec_base.cu
(kernels/matvec.cu before MV_PRELOAD: `git show 9ae5df0:kernels/matvec.cu`, written by
experiments/mv_preload/base.sh), kernels/ untouched (experiments/engine_arm.py): the control arm that
shows MV_PRELOAD 0 (the unit's work moved into one lambda, shared by the preloaded units and the loop)
costs nothing. Bench receipts carry {"matvec": "base"} in their seams.

    bash experiments/mv_preload/base.sh       # here, once: the base copy (build/ is not committed: carry it)
    python3 experiments/mv_preload/ab.py bench synth:llama3-8b:Q8_0 -p 0 -n 128 -r 3 --out X.jsonl
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import engine_arm  # noqa: E402

ARM_FILE = "../experiments/mv_preload/build/matvec_base.cu"   # relative to kernels/
engine_arm.run("matvec.cu", ARM_FILE, {}, {"matvec": "base"}, sys.argv[1:])
