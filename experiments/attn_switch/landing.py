#!/usr/bin/env python3
"""Land the row filter in a checkout (default: this one) if STAGE s wins: kernels/attention.cu edited in place by
make.py's edits (ATT_ROWS / ATT_SWITCH; ATT_ROWS 0 compiles to the same code, so `memra tune carry --from HEAD~1`
keeps the table's receipts), after which MEMRA_ATT_SWITCH runs without ab.py (memra.gpu.ops.attention looks for the
filter in the kernel it compiles). Then: the variant history line in attention.cu's header, the switch's default
(the plan's, or a table entry), docs/FLAGS.md, a kernel-check --add-to on the device (the filtered cases), the GPU
tests.

    python3 experiments/attn_switch/landing.py .
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
    f = root / "kernels" / "attention.cu"
    if "ATT_ROWS" in f.read_text():
        raise SystemExit("attention.cu: the row filter is there already")
    if make_variant(f, f, make.EDITS):
        raise SystemExit("attention.cu: an anchor moved (already landed?)")
