#!/usr/bin/env python3
"""sass_classes (v10): gemm.cu's unit loop by SASS instruction class per IMMA, base vs v9 (GM_STATIC=1)
vs v10a (GM_STATIC=1 GM_RSS=1 GM_AOFF=1) vs v10 (+ GM_XSF=1), config 2,2,2,4,1,3,1,1 (the 512-row one), sm_90a, CPU only.
Reuses experiments/gemm_v9/sass_classes.py (compile through NVRTC with ptxas -v, nvdisasm, loop finding:
unit loop = the innermost loop(s) holding the IMMAs minus the loops nested in them; the v10 row-scalar
pass runs inside the unit loop, so it is counted there). Needs nvdisasm on PATH.
    PYTHONPATH=. python3 experiments/gemm_v10/sass_classes.py
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "gemm_v9"))
import sass_classes as v9  # noqa: E402

CFG512 = v9.CFG512
ARMS = (("base", {"GM_STATIC": 0}), ("v9", {"GM_STATIC": 1}),
        ("v10a", {"GM_STATIC": 1, "GM_RSS": 1, "GM_AOFF": 1}),
        ("v10", {"GM_STATIC": 1, "GM_RSS": 1, "GM_AOFF": 1, "GM_XSF": 1}))
ARMS = tuple(a for a in ARMS if a[0] in __import__("os").environ.get("ARMS", "base v9 v10a v10").split())
MODS = (("Q4_K glu", 12, "gemm_q8_glu"), ("Q4_K", 12, "gemm_q8"), ("Q6_K", 14, "gemm_q8"), ("Q4_0", 2, "gemm_q8"),
        ("Q5_K", 13, "gemm_q8"), ("IQ4_XS", 23, "gemm_q8"), ("Q5_0", 6, "gemm_q8"))


def main() -> int:
    keys = v9.KEYS
    print(f"{'module (2,2,2,4,1,3,1,1)':22s} {'arm':4s} regs spill instrs | unit loop per IMMA: "
          + " ".join(f"{k:>6s}" for k in keys))
    only = set(sys.argv[1:])
    for tname, t, fn in MODS:
        if only and tname not in only:
            continue
        for arm, extra in ARMS:
            defs = {"MV_TYPE": t, **CFG512, **extra}
            cub, log = v9.compile_(defs)
            r, sp = v9.regs(log, fn)
            ntot = sum(1 for s in v9.disasm(cub, fn) if not s.startswith(".L") and v9.opcode(s) != "NOP")
            cubf, _ = v9.compile_({**defs, "GM_SASS_FULL": 1})
            ins = v9.disasm(cubf, fn)
            unit, nimma, nloops, slot_ins = v9.analyse(ins)
            print(f"{tname:22s} {arm:4s} {r:4d} {sp:5d} {ntot:6d} | "
                  + " ".join(f"{unit[k] / nimma:6.2f}" for k in keys) + f"  ({nimma // nloops} IMMA x{nloops} loops)",
                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
