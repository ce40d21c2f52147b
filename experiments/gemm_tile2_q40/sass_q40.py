#!/usr/bin/env python3
"""sass_q40: registers, spills, shared memory and static SASS per IMMA of gemm_tile2_q40.cu's K loop
(CPU, sm_90a), with experiments/gemm_tile2/sass2.py's counting (the stage loop, an inner step loop
weighted by its trips, its once-a-stage blocks counted once) and its short_scoreboard proxy (fraction of
shared-load executions whose result is read within 8 / 16 / 32 instructions).

    python3 experiments/gemm_tile2_q40/sass_q40.py                       # the README's table
    python3 experiments/gemm_tile2_q40/sass_q40.py GT_QT=8 GT_PF=2 [FN=gemm_q80]
"""
from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT / "experiments" / "gemm_tile2"))
sys.path.insert(0, str(ROOT / "experiments" / "gemm_tile"))
sys.path.insert(0, str(ROOT / "experiments" / "mvt"))
import sass_count as scount  # noqa: E402
import sass2  # noqa: E402
import run as R  # noqa: E402

TABLE = tuple((f"{n} {k}", d, R.fns_of(d)[1 if k == 'glu' else 0]) for n, d in R.CONFIGS for k in ("glu", "plain")) + tuple(
    (f"{n} glu", d, R.fns_of(d)[1]) for n, d in R.EXTRA if "su8" not in n)


def main() -> int:
    rows = TABLE
    if len(sys.argv) > 1:
        d = dict(a.split("=", 1) for a in sys.argv[1:])
        d = {k: int(v) if k != "FN" else v for k, v in d.items()}
        fn = d.pop("FN", None) or R.fns_of(d)[1]
        rows = [(" ".join(sys.argv[1:]), d, fn)]
    print(f"{'module':26s} regs spill   smem | per IMMA: " + " ".join(f"{k:>7s}" for k in sass2.KEYS)
          + " | shared loads a IMMA, fraction used within 8 / 16 / 32 instructions")
    for name, defs, fn in rows:
        cub, log = R.compile_module(defs)
        r, sp = scount.regs(log, fn)
        ins = scount.disasm(cub, fn)
        c, nimma, trips = sass2.stage(ins)
        dist = sass2.use_distance(ins)
        tot, near = sass2.weighted_near(ins, dist)
        print(f"{name:26s} {r:4d} {sp:5d} {R.smem_bytes(defs):6d} | " + " ".join(f"{c[k] / nimma:7.2f}" for k in sass2.KEYS)
              + f" | {tot / nimma:.2f} a IMMA: {' / '.join(f'{x:.2f}' for x in near)}   ({nimma} IMMA a stage, loop x{trips})",
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
