#!/usr/bin/env python3
"""Run a memra command with the decode matvec taken from experiments/mv_l2pf/build/matvec.cu at
MV_L2PF = $MV_L2PF_AB (make.py's docstring says what it does), kernels/ untouched.

Every `matvec.cu` module the engine asks for is compiled from the build copy with MV_L2PF added to
its table configuration's defines (MV_L2PF 0 is kernels/matvec.cu's code: the control arm runs the
same copy). The receipts of `memra bench` carry {"MV_L2PF": n} in their `seams`, so `memra research
board` leaves them off the boards (an experiment, not the default engine).

    python3 experiments/mv_l2pf/make.py                      # here, once: generate + compile
    MV_L2PF_AB=1 python3 experiments/mv_l2pf/ab.py bench synth:llama3-8b:Q8_0 -p 0 -n 128 -r 3 --out X.jsonl
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))
sys.path.insert(0, str(HERE))

import make  # noqa: E402

from memra.gpu import cuda  # noqa: E402
from memra.tune import bench as TB  # noqa: E402

N = int(os.environ.get("MV_L2PF_AB", "0"))
make.generate()
_module = cuda.Gpu.module


def module(self, kernel_file, defines=None):
    if kernel_file == "matvec.cu":
        return _module(self, make.ARM_FILE, {**(defines or {}), "MV_L2PF": N})
    return _module(self, kernel_file, defines)


cuda.Gpu.module = module
_seams = TB.seams
TB.seams = lambda: {**_seams(), "MV_L2PF": str(N)}

from memra.cli import app  # noqa: E402

app(prog_name="memra", args=sys.argv[1:])
