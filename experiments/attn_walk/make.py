#!/usr/bin/env python3
"""Write build/attention.cu: kernels/attention.cu with split_body given an explicit (split, S)
(two trailing parameters whose defaults, -1 and 0, keep blockIdx.y and gridDim.y: every existing
caller compiles as before) and walk.cuh (attn_walk) appended, so the new kernel compiles in the
same file as attn_decode.

    python3 experiments/attn_walk/make.py [OUT_FILE]
"""
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
PATCHES = (
    ("    float* ob, const float* qsm = nullptr) {",
     "    float* ob, const float* qsm = nullptr, int split_arg = -1, int S_arg = 0) {"),
    ("    const int hb = blockIdx.x, split = blockIdx.y, t = blockIdx.z, S = gridDim.y;\n    const int n_head = gridDim.x * G;\n    const int kvh",
     "    const int hb = blockIdx.x, t = blockIdx.z;\n    const int split = split_arg >= 0 ? split_arg : (int)blockIdx.y;\n"
     "    const int S = split_arg >= 0 ? S_arg : (int)gridDim.y;\n    const int n_head = gridDim.x * G;\n    const int kvh"),
)


def make(out: Path) -> None:
    src = (ROOT / "kernels" / "attention.cu").read_text()
    for old, new in PATCHES:
        if src.count(old) != 1:
            raise SystemExit(f"make.py: kernels/attention.cu no longer has {old[:60]!r} once")
        src = src.replace(old, new)
    text = src + "\n// ---- experiments/attn_walk/walk.cuh ----\n" + (HERE / "walk.cuh").read_text()
    out.parent.mkdir(parents=True, exist_ok=True)
    if not out.is_file() or out.read_text() != text:
        out.write_text(text)


if __name__ == "__main__":
    make(Path(sys.argv[1]) if len(sys.argv) > 1 else HERE / "build" / "attention.cu")
