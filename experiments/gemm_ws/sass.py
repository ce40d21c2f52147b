#!/usr/bin/env python3
"""Static SASS of every loop of a kernel (experiments/sass_loops.py's disassembly; no GPU): each backward
branch's range, its instruction count, MMAs and top opcode classes, innermost loops first. For gemm_ws's
unit loops (the consumer's step, four inlined copies: A / P x full / partial tiles) and gemm.cu's, to
compare a unit's instructions.

    python3 experiments/gemm_ws/sass.py experiments/gemm_ws/gemm_ws.cu gemm_ws_glu MV_TYPE=12 WS_GLU=1
    python3 experiments/gemm_ws/sass.py gemm.cu gemm_q8_glu MV_TYPE=12 GM_WM=2 GM_WN=2 GM_TM=2 GM_TN=4 \\
        GM_WK=1 GM_STAGES=3 GM_LREG=1 GM_MINB=1
"""
from __future__ import annotations

import collections
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import sass_loops as S  # noqa: E402


def loops(ins, labels):
    out = []
    for a, op, _, t in ins:
        m = re.search(r"\.L_x_(\d+)", t) if op == "BRA" else None
        if m and labels.get(m.group(1), 1 << 40) < a:
            lo, hi = labels[m.group(1)], a
            out.append((lo, hi, [x for x in ins if lo <= x[0] <= hi]))
    return sorted(out, key=lambda x: len(x[2]))


def main() -> int:
    src, entry, *defs = sys.argv[1:]
    defines = dict(kv.split("=", 1) for kv in defs)
    if "/" in src:
        src = str(Path(src).resolve())
    ins, labels = S.instructions(S.disassemble(src, defines), entry)
    print(f"{entry} {defines}: {len(ins)} instructions")
    for lo, hi, body in loops(ins, labels):
        c = collections.Counter(x[1] for x in body)
        mma = c["IMMA"] + c["HMMA"]
        top = ", ".join(f"{k} {v}" for k, v in c.most_common(12))
        print(f"  loop {lo:#x}..{hi:#x}: {len(body)} instructions, {mma} MMA"
              f"{f' ({len(body) / mma:.1f} an MMA)' if mma else ''}: {top}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
