#!/usr/bin/env python3
"""Candidate tables for the MV_EARLY engine A/B (kernels/matvec.cu MV_EARLY 0: nothing issued before the PDL
wait; the same bits).

    python3 experiments/mv_early/tables.py OUT_DIR     -> OUT_DIR/{mid,all}/nvidia-h200.json

mid: the 4096-wide non-GLU matvecs short of the LM head (attn_output, QKV and its parts: the launches after the
     attention and after a RMSNorm), MV_EARLY 0.
all: every batch-1 matvec and matvec_glu entry, MV_EARLY 0.
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import mv_tables  # noqa: E402


def mid(kernel: str, s: dict) -> dict:
    return {"MV_EARLY": 0} if kernel == "matvec" and s["cols"] == 4096 and s["rows"] < 100_000 else {}


GROUPS = {"mid": mid, "all": lambda kernel, s: {"MV_EARLY": 0}}

if __name__ == "__main__":
    mv_tables.write(Path(sys.argv[1]), GROUPS)
