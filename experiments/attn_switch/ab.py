#!/usr/bin/env python3
"""Run a memra command with attention.cu taken from experiments/attn_switch/build/attention.cu (make.py: the row
filter, ATT_ROWS) in every attention.cu module (experiments/engine_arm.py; kernels/ untouched). MEMRA_ATT_SWITCH
(docs/FLAGS.md) turns the switch on; unset, every module is built at ATT_ROWS 0, kernels/' code (the control arm).
Bench receipts carry {"attention": "attn_switch"} in seams, and MEMRA_ATT_SWITCH's value when set.

    python3 experiments/attn_switch/ab.py bench synth:llama3-8b:Q4_K_M -p 0 -n 128                       # control
    MEMRA_ATT_SWITCH=256 python3 experiments/attn_switch/ab.py bench synth:llama3-8b:Q4_K_M -p 0 -n 128  # switch
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

    if make.main():
        sys.exit(1)
    engine_arm.run("attention.cu", make.ARM_FILE, {}, {"attention": "attn_switch"}, sys.argv[1:])
