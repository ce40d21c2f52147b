#!/usr/bin/env python3
"""Candidate tables for the MV_PRELOAD engine A/B (experiments/mv_preload/preload.patch applied to
kernels/matvec.cu; session 28, withdrawn: README.md).

    python3 experiments/mv_preload/tables.py OUT_DIR     -> OUT_DIR/{mid,all}/nvidia-h200.json

mid: the 4096-wide non-GLU matvecs short of the LM head (attn_output, QKV and its parts), MV_PRELOAD 2:
     at K = 4096 a lane has 2 units a row, so its whole slice is in registers before the wait.
all: mid, plus gate+up (4096-wide GLU, MV_PRELOAD 2) and ffn_down (14,336-wide, the first 2 of 7 units).
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import mv_tables  # noqa: E402


def mid(kernel: str, s: dict) -> dict:
    return {"MV_PRELOAD": 2} if mv_tables.mid_size(kernel, s) else {}


def every(kernel: str, s: dict) -> dict:
    big = (kernel == "matvec_glu" and s["cols"] == 4096) or (kernel == "matvec" and s["cols"] == 14336)
    return {"MV_PRELOAD": 2} if big else mid(kernel, s)


GROUPS = {"mid": mid, "all": every}

if __name__ == "__main__":
    mv_tables.write(Path(sys.argv[1]), GROUPS)
