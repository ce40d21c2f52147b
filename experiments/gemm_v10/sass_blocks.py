#!/usr/bin/env python3
"""sass_blocks (v10): the basic blocks of gemm.cu's unit loop (the innermost loop holding the IMMAs,
nested loops listed too) for one arm, with their static sizes and how they end, config 2,2,2,4,1,3,1,1,
GM_SASS_FULL=1 (counting only). Used to weight the static count by what a warp executes (README:
the row-scalar switch runs one case of four; the v10 pass's row part runs in warps 0-1, its column
part in warps 2-3).
    PYTHONPATH=. python3 experiments/gemm_v10/sass_blocks.py ARM MV_TYPE FN
    ARM: base | v9 | v10a | v10     e.g.  v10 12 gemm_q8_glu
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "gemm_v9"))
import sass_classes as v9  # noqa: E402

ARMS = {"base": {"GM_STATIC": 0}, "v9": {"GM_STATIC": 1}, "v10a": {"GM_STATIC": 1, "GM_RSS": 1, "GM_AOFF": 1},
        "v10": {"GM_STATIC": 1, "GM_RSS": 1, "GM_AOFF": 1, "GM_XSF": 1}}


def main() -> int:
    arm, t, fn = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    cub, _ = v9.compile_({"MV_TYPE": t, **v9.CFG512, **ARMS[arm], "GM_SASS_FULL": 1})
    ins = v9.disasm(cub, fn)
    lp = v9.loops(ins)
    imma = [i for i, s in enumerate(ins) if "IMMA" in s]
    inner = [(h, b) for h, b in lp if any(h < i < b for i in imma) and not any(
        h < h2 and b2 <= b and (h2, b2) != (h, b) and any(h2 < i < b2 for i in imma) for h2, b2 in lp)]
    h, b = inner[0]
    blocks = v9.scount.basic_blocks(ins[h:b + 1])
    tot = 0
    for bl in blocks:
        n = sum(1 for s in bl if not s.startswith(".L") and v9.opcode(s) != "NOP")
        tot += n
        lab = bl[0] if bl[0].startswith(".L") else ""
        print(f"{lab:14s} n={n:4d} imma={sum('IMMA' in s for s in bl):2d} "
              f"f16={sum(bool(re.search('HADD2|F2F', s)) for s in bl)} shfl={sum('SHFL' in s for s in bl)} "
              f"ends: {bl[-1].strip()[:70]}")
    print(f"{arm} MV_TYPE={t} {fn}: {tot} instructions in the first unit loop (nested loops included), "
          f"{len(inner)} unit loop(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
