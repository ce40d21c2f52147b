#!/usr/bin/env python3
"""Land the fold in a checkout (default: this one): kernels/matvec.cu edited in place by make.py's edits (what the
probe and ab.py measure from the build copy), with its history line. MV_NORM 0 compiles every existing module to the
same code, so the tuning receipts carry over instead of a new campaign:

    python3 experiments/norm_pro/landing.py . && git commit -am "..."
    python3 -m memra tune carry --from HEAD~1          # CPU: every measured matvec.cu module compared, records written
    python3 -m memra tune freeze --device "NVIDIA H200" --out-dir tune/defaults --pdl
    python3 -m memra tune show                          # stale: none

then MEMRA_NORM_PRO's default (memra.gpu.plan.prologue_groups) to the groups the engine A/B chose, and on the device
kernel-check --add-to (the matvec family runs whole: its source changed; the folded launches are new cases).
"""
from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))
from kernel_edit import make_variant  # noqa: E402
import make  # noqa: E402

HISTORY = (
    "//     same accum, so its results equal mv_q8's bit for bit.\n",
    "//     same accum, so its results equal mv_q8's bit for bit.\n"
    "//  6. MV_NORM: mv_q8n / mv_q8n_glu normalize (rmsnorm, add_rmsnorm with post-norms) or quantize the f32 rows\n"
    "//     in the prologue, in the norm's own reduction order at NORM_THREADS = MV_NORM, so a decode step's norm\n"
    "//     launch and its hop go and the bits stay (experiments/norm_pro; research/2026-12-04-session32).\n",
)

if __name__ == "__main__":
    root = Path(sys.argv[1] if len(sys.argv) > 1 else ".").resolve()
    f = root / "kernels" / "matvec.cu"
    if make_variant(f, f, [HISTORY] + make.edits()):
        raise SystemExit("matvec.cu: an anchor moved (already landed?)")
