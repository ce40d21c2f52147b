#!/usr/bin/env python3
"""Candidate tables for the MV_EARLY engine A/B (experiments/mv_early/make.py's MV_EARLY 0: nothing issued before
the PDL wait; the same bits; run through experiments/mv_early/ab.py).

    python3 experiments/mv_early/tables.py OUT_DIR     -> OUT_DIR/{mid,all,kbig}/nvidia-h200.json

mid: the 4096-wide non-GLU matvecs short of the LM head (attn_output, QKV and its parts: the launches after the
     attention and after a RMSNorm), MV_EARLY 0.
all: every batch-1 matvec and matvec_glu entry, MV_EARLY 0.
kbig: the K-quant entries outside mid (gate+up, ffn_down, the Q6_K heads, the small models' K-quant matvecs),
     MV_EARLY 0: session 28's 8B Q4_K_M gained +0.7 % with all and lost 1.3 % with mid (research/2026-12-04-session28).
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import mv_tables  # noqa: E402


def mid(kernel: str, s: dict) -> dict:
    return {"MV_EARLY": 0} if mv_tables.mid_size(kernel, s) else {}


def kbig(kernel: str, s: dict) -> dict:
    return {"MV_EARLY": 0} if s["type"] in ("Q4_K", "Q5_K", "Q6_K") and not mid(kernel, s) else {}


GROUPS = {"mid": mid, "all": lambda kernel, s: {"MV_EARLY": 0}, "kbig": kbig}

if __name__ == "__main__":
    mv_tables.write(Path(sys.argv[1]), GROUPS)
