#!/usr/bin/env python3
"""Write build/attention.cu: kernels/attention.cu unchanged, with rows.cuh (attn_prefill_rows)
appended, so the new kernel compiles in the same file as attn_decode (the same helpers,
constants and compiler context).

    python3 experiments/attn_rows2/make.py [OUT_FILE]
"""
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]


def make(out: Path) -> None:
    src = (ROOT / "kernels" / "attention.cu").read_text()
    rows = (HERE / "rows.cuh").read_text()
    out.parent.mkdir(parents=True, exist_ok=True)
    text = src + "\n// ---- experiments/attn_rows2/rows.cuh ----\n" + rows
    if not out.is_file() or out.read_text() != text:
        out.write_text(text)


if __name__ == "__main__":
    make(Path(sys.argv[1]) if len(sys.argv) > 1 else HERE / "build" / "attention.cu")
