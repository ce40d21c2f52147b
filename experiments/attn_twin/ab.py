#!/usr/bin/env python3
"""Run a memra command with attention.cu taken from experiments/attn_fixed/build/attention.cu at
ATT_TWINREG = $ATT_TWINREG_AB (0: kernels/attention.cu's code; 1: the q8 twin from registers, a warp a
block of 32, no staging barrier: experiments/attn_fixed/README.md), kernels/ untouched
(experiments/engine_arm.py: ATT_PROBE 0, the control arm runs the same copy; bench receipts carry
{"ATT_TWINREG": n} in their seams).

    ATT_TWINREG_AB=1 python3 experiments/attn_twin/ab.py bench synth:llama-1b:Q4_0 -p 0 -n 128 -r 3 --out X.jsonl
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

EXP = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(EXP))
sys.path.insert(0, str(EXP / "attn_fixed"))

import engine_arm  # noqa: E402
import probe  # noqa: E402

N = os.environ.get("ATT_TWINREG_AB", "0")
probe.generate()
engine_arm.run(probe.ATT.KERNEL_FILE, probe.ARM_FILE, {"ATT_PROBE": 0, "ATT_TWINREG": int(N)}, {"ATT_TWINREG": N},
               sys.argv[1:])
