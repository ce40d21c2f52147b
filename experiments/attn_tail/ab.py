#!/usr/bin/env python3
"""Run a memra command with attention.cu's modules taken from experiments/attn_tail/build/attention.cu (probe.py's
generated copy) with one of probe.py's bit-neutral arms' defines added (experiments/engine_arm.py; kernels/
untouched): the engine A/B of a candidate the probe prices alone. `kernels` runs kernels/attention.cu itself (the
control, through the same runner). Bench receipts carry {"attention": "attn_tail:<arm>"} in their seams.

    python3 experiments/attn_tail/ab.py best bench smollm2-135m -d 4096 -p 0 -n 128 -r 3 --out X.jsonl
"""
from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

import engine_arm  # noqa: E402
import probe  # noqa: E402

arm, argv = sys.argv[1], sys.argv[2:]
if arm == "kernels":
    engine_arm.run("attention.cu", "attention.cu", {}, {"attention": "attn_tail:kernels"}, argv)
elif arm in probe.NEUTRAL:
    probe.generate()
    engine_arm.run("attention.cu", probe.ARM_FILE, probe.ARMS[arm], {"attention": f"attn_tail:{arm}"}, argv)
else:
    raise SystemExit(f"attn_tail/ab.py: arm must be kernels or one of {', '.join(probe.NEUTRAL)}, got {arm!r}")
