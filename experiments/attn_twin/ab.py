#!/usr/bin/env python3
"""Run a memra command with attention.cu taken from experiments/attn_fixed/build/attention.cu at
ATT_TWINREG = $ATT_TWINREG_AB (0: kernels/attention.cu's code; 1: the q8 twin from registers, a warp a
block of 32, no staging barrier: experiments/attn_fixed/README.md), kernels/ untouched.

Every `attention.cu` module the engine asks for is compiled from the probe's build copy with ATT_PROBE 0
and ATT_TWINREG added to its configuration's defines (the control arm runs the same copy at 0). The
receipts of `memra bench` carry {"ATT_TWINREG": n} in their `seams`, so `memra research board` leaves
them off the boards.

    ATT_TWINREG_AB=1 python3 experiments/attn_twin/ab.py bench synth:llama-1b:Q4_0 -p 0 -n 128 -r 3 --out X.jsonl
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "experiments" / "attn_fixed"))

import probe  # noqa: E402

from memra.gpu import cuda  # noqa: E402
from memra.gpu.ops import attention as ATT  # noqa: E402
from memra.tune import bench as TB  # noqa: E402

N = int(os.environ.get("ATT_TWINREG_AB", "0"))
probe.generate()
_module = cuda.Gpu.module


def module(self, kernel_file, defines=None):
    if kernel_file == ATT.KERNEL_FILE:
        return _module(self, probe.ARM_FILE, {**(defines or {}), "ATT_PROBE": 0, "ATT_TWINREG": N})
    return _module(self, kernel_file, defines)


cuda.Gpu.module = module
_seams = TB.seams
TB.seams = lambda: {**_seams(), "ATT_TWINREG": str(N)}

from memra.cli import app  # noqa: E402

app(prog_name="memra", args=sys.argv[1:])
