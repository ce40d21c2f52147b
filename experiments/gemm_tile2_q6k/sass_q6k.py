#!/usr/bin/env python3
"""sass_q6k: registers, spills, shared memory and static SASS of gemm_tile2_q6k.cu's K loop (CPU, sm_90a)
per IMMA-equivalent: one m16n8k32 block of MACs (a k32 step x m16 x n8 tile; 128 a warp and stage), i.e.
two m16n8k16 IMMAs here (+ 1/4 offset IMMA with GT_SIGNED 0), one IMMA in gemm_tile2's Q4_K table.
Counting as experiments/gemm_tile2/sass2.py (classes of experiments/mvt/sass_count.py): the half loop
(GT_PU 1: 2 trips a stage) x its trips, its once-a-stage blocks (code skipped by a forward branch inside
the loop: the refill / barrier / scalar pass, the next half's raw loads) once, plus the rest of the stage
loop. And sass2's short_scoreboard proxy: for each LDS / LDSM, the instructions to the first reader.

    python3 experiments/gemm_tile2_q6k/sass_q6k.py                  # the README's table (sass_table.txt)
    python3 experiments/gemm_tile2_q6k/sass_q6k.py GT_FORM=1 GT_PF=0 [-v]
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
import sass2  # noqa: E402  (CLASSES, use_distance, conditional)
import run as R  # noqa: E402

# sass2's classes with the integer ALU split (the A build: LOP3 / IMAD / shifts) and I2F (incl. I2FP)
_SPLIT = (("LOP3", r"^LOP3"), ("IMAD", r"^IMAD(?!\.MOV)"), ("SHF/LEA/IADD", r"^(SHF|LEA|IADD3|VIADD)"))
CLASSES = tuple(x for c in sass2.CLASSES for x in ((_SPLIT + (c,)) if c[0] == "intALU" else (c,)))
KEYS = [k for k, _ in CLASSES] + ["other", "total"]
FN = "gemm_tile_q6k"


def stage(ins, stage_imma):
    """(class counts of one K stage, trips of the half loop)."""
    lp = scount.loops(ins)
    imma = [i for i, s in enumerate(ins) if "IMMA" in s]
    with_imma = [(h, b) for h, b in lp if any(h < i < b for i in imma)]
    inner = min(with_imma, key=lambda hb: hb[1] - hb[0])
    n_in = sum(1 for i in range(*inner) if "IMMA" in ins[i])
    outer = [(h, b) for h, b in with_imma if h < inner[0] and inner[1] < b]
    trips = stage_imma // n_in
    if trips == 1 or not outer:
        return scount.classify([ins[i] for i in range(inner[0], inner[1] + 1)], CLASSES), 1, inner, set()
    o = min(outer, key=lambda hb: hb[1] - hb[0])
    cond = sass2.conditional(ins, *inner)
    c_always = scount.classify([ins[i] for i in range(inner[0], inner[1] + 1) if i not in cond], CLASSES)
    c_once = scount.classify([ins[i] for i in sorted(cond)], CLASSES)
    c_out = scount.classify([ins[i] for i in range(o[0], o[1] + 1) if not inner[0] <= i <= inner[1]], CLASSES)
    return {k: trips * c_always[k] + c_once[k] + c_out[k] for k in c_always}, trips, inner, cond


def near(ins, dist, inner, cond, trips, ks=(8, 16, 32)):
    w = [(trips if inner[0] <= i <= inner[1] and i not in cond else 1) for _, _, i in dist]
    tot = sum(w)
    return tot, [sum(wi for wi, (d, _, _) in zip(w, dist) if d <= k) / tot for k in ks]


def main() -> int:
    verbose = "-v" in sys.argv
    argv = [a for a in sys.argv[1:] if a != "-v"]
    rows = R.CONFIGS + R.SASS_ONLY
    if argv:
        rows = ((" ".join(argv), {**R.G24, **{k: int(v) for k, v in (a.split("=", 1) for a in argv)}}),)
    print(f"{'module':30s} regs spill   smem | per IMMA-eq: " + " ".join(f"{k:>7s}" for k in KEYS)
          + " | shared loads a IMMA-eq, fraction used within 8 / 16 / 32 instructions")
    for name, defs in rows:
        cub, log = R.compile_module(defs)
        r, sp = scount.regs(log, FN)
        ins = scount.disasm(cub, FN)
        stage_imma = 256 + (64 if int(defs.get("GT_SIGNED", 1)) == 0 else 0)
        c, trips, inner, cond = stage(ins, stage_imma)
        dist = sass2.use_distance(ins)
        tot, nr = near(ins, dist, inner, cond, trips)
        print(f"{name:30s} {r:4d} {sp:5d} {R.smem_bytes(defs):6d} | " + " ".join(f"{c[k] / 128:7.2f}" for k in KEYS)
              + f" | {tot / 128:.2f} a IMMA-eq: {' / '.join(f'{x:.2f}' for x in nr)}   (half loop x{trips})", flush=True)
        if verbose:
            for d, op, i in dist:
                if d <= 32:
                    print(f"    {op:16s} at {i}: used after {d}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
