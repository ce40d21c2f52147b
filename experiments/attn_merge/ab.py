#!/usr/bin/env python3
"""Run a memra command with attention.cu taken from experiments/attn_merge/build/attention.cu (make.py: kernels/
attention.cu with ATT_MERGE_MJ) at ATT_MERGE_MJ = $MERGE_MJ (default 16; 0 is the control: kernels/attention.cu's
code, the same SASS), kernels/ untouched (experiments/engine_arm.py). Bench receipts carry
{"attention": "attn_merge MJ"} in their seams (off the boards).

    MERGE_MJ=16 python3 experiments/attn_merge/ab.py bench synth:llama3-8b:Q4_K_M -p 0 -n 128 -d 4096 -r 3 --out X.jsonl
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

mj = int(os.environ.get("MERGE_MJ", "16"))
make.generate()
engine_arm.run("attention.cu", make.ARM_FILE, {"ATT_MERGE_MJ": mj}, {"attention": f"attn_merge {mj}"}, sys.argv[1:])
