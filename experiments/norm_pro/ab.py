#!/usr/bin/env python3
"""Run a memra command with matvec.cu taken from experiments/norm_pro/build/matvec.cu (make.py: MV_NORM and the
mv_q8n entry points; MV_NORM 0 builds kernels/matvec.cu's SASS) in every matvec.cu module (experiments/engine_arm.py;
kernels/ untouched), so that MEMRA_NORM_PRO (memra.gpu.plan.prologue_groups: the decode step's norms and
quantizes folded into the prologue of the mv_q8 launches that read them) can run. Bench receipts carry
{"matvec": "norm_pro"} in seams (and MEMRA_NORM_PRO, a measurement knob, in its own).

    MEMRA_NORM_PRO=all python3 experiments/norm_pro/ab.py bench synth:llama-1b:Q4_0 -p 0 -n 128
"""
from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

if __name__ == "__main__":
    import engine_arm  # noqa: E402
    import make  # noqa: E402

    make.generate()
    engine_arm.run("matvec.cu", make.ARM_FILE, {}, {"matvec": "norm_pro"}, sys.argv[1:])
