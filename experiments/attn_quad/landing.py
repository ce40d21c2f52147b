#!/usr/bin/env python3
"""Land the candidate v12 in a checkout (default: this one): kernels/attn_tc.cuh and kernels/attention.cu edited in
place by make.py's edits (the build copy the probes and ab.py measure, without its inlining), then the host side:

    python3 experiments/attn_quad/landing.py . && git apply experiments/attn_quad/host.patch

host.patch: memra.gpu.ops.attention's tc_supported accepts ATT_TILE = 4 ATT_WARPS, kernel-check compares a TC module
with its other warp layout at any tile both run (32-key tiles: the quad with the pair), compile_variants likewise,
tests/test_attn_tc.py and docs/FLAGS.md. The table and the kernel-check receipt go stale, as with any kernel change.
"""
from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))
from kernel_edit import make_variant  # noqa: E402
import make  # noqa: E402

if __name__ == "__main__":
    root = Path(sys.argv[1] if len(sys.argv) > 1 else ".").resolve()
    tc, att = make.landing_edits()
    for name, edits in (("attn_tc.cuh", tc), ("attention.cu", att)):
        f = root / "kernels" / name
        if make_variant(f, f, edits):
            raise SystemExit(f"{name}: an anchor moved (already landed?)")
