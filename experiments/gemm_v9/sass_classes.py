#!/usr/bin/env python3
"""sass_classes: gemm.cu's K loop by SASS instruction class, base vs GM_STATIC=1 (CPU, sm_90a, variant 9).

Each module is compiled twice through NVRTC (memra's options: memra.gpu.compile.options_for, plus
ptxas -v): as shipped (registers / spills / total instructions), and with GM_SASS_FULL=1 (the
partial-block consume copy left out: counting only) for the loop analysis. Loops are found from
nvdisasm's labels and back-edges:
  unit loop   the innermost loop(s) holding the IMMAs, minus the loops nested in them (the
              producer's empty-slot skip; in the base, the slot-merge loop with the switch):
              what a unit costs when no slot ends. Printed per IMMA.
  slot code   base: the loops nested in the unit loop that hold FADDs (the merge loop: the
              dispatch block and the switch's cases). GM_STATIC: the pair loop minus its unit
              loops (the zeroing, the level-0 add, the level branches). Printed per block
              (FADD / LDS / STS / MOV / CS2R / rest), to weight by how often each runs (README).
    python3 experiments/gemm_v9/sass_classes.py                 # the README table
    python3 experiments/gemm_v9/sass_classes.py MV_TYPE=12 GM_WM=2 ... [FN=gemm_q8_glu] [BLOCKS=1]
Run with the tree's kernels/ patched (experiments/gemm_v9/gemm.patch applied), PYTHONPATH=. .
"""
from __future__ import annotations

import io
import os
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "experiments" / "mvt"))
import sass_count as scount  # noqa: E402  (disasm, regs, opcode, classify)
KDIR = Path(os.environ.get("KDIR", ROOT / "kernels"))

CLASSES = scount.GEMM_CLASSES
KEYS = [k for k, _ in CLASSES] + ["other", "total"]


def compile_(defs: dict) -> tuple[bytes, str]:
    from cuda.core import Program, ProgramOptions
    opts = ProgramOptions(name="gemm.cu", arch="sm_90a", std="c++17", lineinfo=True, include_path=[str(KDIR)],
                          define_macro=[(k, str(v)) for k, v in sorted(defs.items())], ptxas_options=["-v"])
    log = io.StringIO()
    obj = Program((KDIR / "gemm.cu").read_text(), "c++", opts).compile("cubin", logs=log)
    return bytes(obj.code), log.getvalue()


regs = scount.regs
disasm = scount.disasm
opcode = scount.opcode


def classify(seg) -> dict:
    return scount.classify(seg, CLASSES)


loops = scount.loops


def analyse(ins):
    lp = loops(ins)
    imma = [i for i, s in enumerate(ins) if "IMMA" in s]
    inner = [(h, b) for h, b in lp if any(h < i < b for i in imma)
             and not any(h < h2 and b2 <= b and (h2, b2) != (h, b) and any(h2 < i < b2 for i in imma) for h2, b2 in lp)]
    unit_idx, slot_idx = set(), []
    for h, b in inner:
        nested = [(h2, b2) for h2, b2 in lp if h < h2 and b2 < b]
        nest_set = {i for h2, b2 in nested for i in range(h2, b2 + 1)}
        unit_idx |= {i for i in range(h, b + 1) if i not in nest_set}
        for h2, b2 in nested:
            seg = ins[h2:b2 + 1]
            if classify(seg)["FADD"] >= 32 and not any((h3 < h2 and b2 < b3) for h3, b3 in nested):
                slot_idx.append((h2, b2))
    nimma = sum(1 for i in unit_idx if "IMMA" in ins[i])
    unit = classify([ins[i] for i in sorted(unit_idx)])
    if not slot_idx:   # GM_STATIC: the pair loop = the innermost loop around the unit loops, minus them
        outer = [(h, b) for h, b in lp if all(h < h1 and b1 < b for h1, b1 in inner)]
        h, b = min(outer, key=lambda hb: hb[1] - hb[0])
        skip = {i for h1, b1 in inner for i in range(h1, b1 + 1)}
        # the unit loops' own guards / preheaders stay in the pair code (they run once a leaf)
        slot_idx = [(h, b)]
        slot_ins = [i for i in range(h, b + 1) if i not in skip]
    else:
        slot_ins = [i for h2, b2 in slot_idx for i in range(h2, b2 + 1)]
    return unit, nimma, len(inner), slot_ins


def blocks(ins, idx):
    """Per basic block (split at labels and after branches) of the slot code: compact class counts."""
    out = scount.basic_blocks([ins[i] for i in idx])
    rows = []
    for b in out:
        c = Counter(opcode(s) for s in b if not s.startswith(".L"))
        n = sum(c.values())
        if not n:
            continue
        main = {k: sum(v for o, v in c.items() if o.split(".")[0] == k) for k in ("FADD", "LDS", "STS", "MOV", "CS2R")}
        lab = b[0] if b[0].startswith(".L") else ""
        rows.append(f"    {lab:14s} n={n:4d} " + " ".join(f"{k}={v}" for k, v in main.items() if v)
                    + f" rest={n - sum(main.values())}  ends: {b[-1][:60]}")
    return rows


CFG512 = {"GM_WM": 2, "GM_WN": 2, "GM_TM": 2, "GM_TN": 4, "GM_WK": 1, "GM_STAGES": 3, "GM_LREG": 1, "GM_MINB": 1}
CFG64 = {"GM_WM": 2, "GM_WN": 1, "GM_TM": 2, "GM_TN": 4, "GM_WK": 2, "GM_STAGES": 3, "GM_LREG": 1, "GM_MINB": 2}
TABLE = []
for cname, cfg in (("2,2,2,4,1,3,1,1", CFG512), ("2,1,2,4,2,3,1,2", CFG64)):
    for tname, t, fn in (("Q4_K glu", 12, "gemm_q8_glu"), ("Q6_K", 14, "gemm_q8"), ("Q4_0", 2, "gemm_q8")):
        for st in ((0, 1) if cfg["GM_WK"] == 1 else (1,)):
            TABLE.append((f"{tname} {cname} S{st}", {"MV_TYPE": t, **cfg, "GM_STATIC": st}, fn))


def main() -> int:
    rows = TABLE
    show_blocks = os.environ.get("BLOCKS") == "1"
    if len(sys.argv) > 1:
        d = dict(a.split("=", 1) for a in sys.argv[1:])
        fn = d.pop("FN", "gemm_q8")
        rows = [(" ".join(sys.argv[1:]), d, fn)]
    print(f"{'module':28s} regs spill instrs | unit loop per IMMA: " + " ".join(f"{k:>6s}" for k in KEYS)
          + " | IMMA/unit-loop, slot-code static instrs (FADD LDS STS MOV)")
    for name, defs, fn in rows:
        cub, log = compile_(defs)
        r, sp = regs(log, fn)
        ntot = sum(1 for s in disasm(cub, fn) if not s.startswith(".L") and opcode(s) != "NOP")
        if int(defs.get("GM_WK", 1)) != 1:   # GM_STATIC applies to GM_WK 1 only: the same module
            same = cub == compile_({**defs, "GM_STATIC": 1 - int(defs.get("GM_STATIC", 0))})[0]
            print(f"{name:28s} {r:4d} {sp:5d} {ntot:6d} | GM_WK != 1: the slot walk; cubin with GM_STATIC "
                  f"flipped {'identical' if same else 'DIFFERENT'}", flush=True)
            continue
        cubf, _ = compile_({**defs, "GM_SASS_FULL": 1})
        ins = disasm(cubf, fn)
        unit, nimma, nloops, slot_ins = analyse(ins)
        sc = classify([ins[i] for i in slot_ins])
        print(f"{name:28s} {r:4d} {sp:5d} {ntot:6d} | " + " ".join(f"{unit[k] / nimma:6.2f}" for k in KEYS)
              + f" | {nimma // nloops} x{nloops}, {sc['total']} ({sc['FADD']} {sc['LDS']} {sc['STS']} {sc['MOV']})", flush=True)
        if show_blocks:
            print("\n".join(blocks(ins, slot_ins)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
