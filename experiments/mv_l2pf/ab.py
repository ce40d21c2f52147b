#!/usr/bin/env python3
"""Run a memra command with the decode matvec taken from experiments/mv_l2pf/build/matvec.cu at
MV_L2PF = $MV_L2PF_AB (make.py's docstring says what it does), kernels/ untouched
(experiments/engine_arm.py; MV_L2PF 0 is kernels/matvec.cu's code: the control arm runs the same
copy; bench receipts carry {"MV_L2PF": n} in their seams).

    python3 experiments/mv_l2pf/make.py                      # here, once: generate + compile
    MV_L2PF_AB=1 python3 experiments/mv_l2pf/ab.py bench synth:llama3-8b:Q8_0 -p 0 -n 128 -r 3 --out X.jsonl
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

import engine_arm  # noqa: E402
import make  # noqa: E402

N = os.environ.get("MV_L2PF_AB", "0")
make.generate()
engine_arm.run("matvec.cu", make.ARM_FILE, {"MV_L2PF": int(N)}, {"MV_L2PF": N}, sys.argv[1:])
