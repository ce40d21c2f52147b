#!/usr/bin/env python3
"""Run a memra command with attention.cu taken from experiments/attn_quad/build/attention.cu (make.py) at ATT_TC 1
in every attention.cu module (experiments/engine_arm.py; kernels/ untouched): with a table whose attn_decode entry
is 32-key tiles at 8 warps, the tensor-core body as a warp quad a slice. Only models whose every attention module
can take the tensor cores (f16 cache, head 64 or 128). Bench receipts carry {"attention": "attn_quad"} in seams.

    python3 experiments/attn_quad/ab.py bench synth:llama3-8b:Q4_K_M -p 0 -n 128 -d 4096 --tune-table T.json
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
    engine_arm.run("attention.cu", make.ARM_FILE, {"ATT_TC": 1}, {"attention": "attn_quad"}, sys.argv[1:])
