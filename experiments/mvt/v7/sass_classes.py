#!/usr/bin/env python3
"""sass_classes: per-unit SASS instruction counts of mvt.cu's K loop by class, on the CPU (variant 7's analysis).

Layout 0: the segment experiments/mvt/sass_count.py counts (loop head to the end of the last n tile's
accumulation plus the consumer's advance; slot merges and the producer's empty-slot skip excluded).
Layout 1 and MVT_SB: the whole innermost loop that holds the first IMMA (head label .. back-edge),
divided by the units it holds (IMMA count / IMMAs a unit) -- so the stage producer, barrier and
loop overhead are included there. Prints registers / spills (ptxas -v) too.

    python3 experiments/mvt/v7/sass_classes.py                   # the README table
    python3 experiments/mvt/v7/sass_classes.py MV_TYPE=12 MVT_SB=1 MVT_TN=1 MVT_KPERM=1 [FN=mvt_q8_glu]
"""
from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
import sass_count as sc  # noqa: E402

CLASSES = (
    ("IMMA", r"^IMMA"), ("LDG", r"^LDG(\.|$)"), ("LDS", r"^LDS(\.|$)"), ("LDSM", r"^LDSM"),
    ("LDGSTS", r"^LDGSTS"), ("STS", r"^STS"), ("I2F", r"^I2F"),
    ("FFMA", r"^FFMA"), ("FMUL", r"^FMUL"), ("FADD", r"^FADD"), ("f16cvt", r"^(HADD2|F2F|HMUL2)"),
    ("SHFL", r"^SHFL"), ("BAR", r"^(BAR|DEPBAR|LDGDEPBAR)"), ("BRA", r"^(BRA|BSSY|BSYNC|WARPSYNC|EXIT|CALL|RET)"),
    ("intALU", r"^(LOP3|SHF|IADD3|IMAD|PRMT|SGXT|BMSK|ISETP|LEA|SEL|IMNMX|FLO|POPC|BREV|IABS|VIADD|VIMNMX|P2R|R2P|PLOP3|FSEL|FSETP|UIADD3|ULOP3|USHF|UIMAD|ULEA|USEL|UISETP|UMOV|ULDC|S2R|S2UR|CS2R|R2UR)"),
    ("MOV", r"^MOV"),
)


disasm = sc.disasm


opcode = sc.opcode


def classify(seg: list[str]) -> dict:
    return sc.classify(seg, CLASSES)


def loop_segment(ins: list[str]) -> tuple[list[str], int]:
    """The innermost loop holding the first IMMA: (its instructions, IMMA count)."""
    is_lab = lambda s: s.startswith(".L")
    first = next(i for i, s in enumerate(ins) if "IMMA" in s)
    best = None
    for h in [i for i in range(first) if is_lab(ins[i])]:
        lab = ins[h].rstrip(":")
        be = [i for i in range(first, len(ins)) if "BRA" in ins[i] and f"({lab})" in ins[i]]
        if be and (best is None or be[0] - h < best[1] - best[0]):
            best = (h, be[0])
    h, b = best
    seg = [s for s in ins[h:b + 1] if not is_lab(s)]
    return seg, sum(1 for s in seg if "IMMA" in s)


def layout0_segment(ins: list[str]) -> list[str]:
    """sass_count.unit_count's segment (common path of one unit: body and advance)."""
    body, adv = sc.unit_segment(ins)
    return body + adv


def count(defs: dict, fn: str = "mvt_q8") -> dict:
    cub, log = sc.compile_cubin(defs)
    r, sp = sc.regs(log, fn)
    ins = disasm(cub, fn)
    imma_unit = 4 if int(defs.get("MV_TYPE")) == 14 else 2
    imma_unit *= int(defs.get("MVT_TN", 2))
    if int(defs.get("MVT_LAYOUT", 0)) == 1 or int(defs.get("MVT_SB", 0)) == 1:
        seg, nimma = loop_segment(ins)
        units = nimma / imma_unit
        how = "loop/units"
    else:
        seg = layout0_segment(ins)
        units = 1
        how = "unit seg"
    c = classify(seg)
    per = {k: v / units for k, v in c.items()}
    per["total"] = len(seg) / units
    return {"regs": r, "spill": sp, "units_in_seg": units, "how": how, **per}


BPU = {2: 16 * 36, 8: 16 * 68, 12: 16 * 36, 13: 16 * 44, 14: 16 * 52.5}   # weight bytes a warp and unit
TN1 = {"MVT_TN": 1, "MVT_WK": 8, "MVT_PREFETCH": 2, "MVT_MINB": 2, "MVT_KPERM": 1}
L1 = {"MVT_LAYOUT": 1, "MVT_TN": 1, "MVT_WK": 8, "MVT_MINB": 2, "MVT_UPW": 1, "MVT_STAGES": 3, "MVT_KPERM": 0}
TABLE = []
for tname, t in (("Q4_K", 12), ("Q4_0", 2), ("Q8_0", 8), ("Q6_K", 14)):
    for fn in ("mvt_q8", "mvt_q8_glu"):
        TABLE.append((f"{tname} L0 {fn[4:]}", {"MV_TYPE": t, **TN1}, fn))
        TABLE.append((f"{tname} L1 {fn[4:]}", {"MV_TYPE": t, **L1}, fn))
TABLE += [("Q4_K SB glu", {"MV_TYPE": 12, **TN1, "MVT_SB": 1}, "mvt_q8_glu"),
          ("Q4_K SB plain", {"MV_TYPE": 12, **TN1, "MVT_SB": 1}, "mvt_q8"),
          ("Q5_K L0 glu", {"MV_TYPE": 13, **TN1}, "mvt_q8_glu"),
          ("Q5_K SB glu", {"MV_TYPE": 13, **TN1, "MVT_SB": 1}, "mvt_q8_glu")]


def main() -> int:
    rows = TABLE
    if len(sys.argv) > 1:
        d = dict(a.split("=", 1) for a in sys.argv[1:])
        fn = d.pop("FN", "mvt_q8")
        rows = [(" ".join(sys.argv[1:]), d, fn)]
    keys = [k for k, _ in CLASSES] + ["other", "total"]
    print(f"{'module (TN 1, WK 8)':22s} regs spill " + " ".join(f"{k:>6s}" for k in keys) + "  B/unit  B/instr")
    for name, defs, fn in rows:
        try:
            c = count(defs, fn)
        except Exception as e:  # noqa: BLE001
            print(f"{name:22s} ERROR {type(e).__name__}: {str(e)[:200]}")
            continue
        b = BPU[int(defs["MV_TYPE"])]
        print(f"{name:22s} {c['regs']:4d} {c['spill']:5d} " + " ".join(f"{c[k]:6.1f}" for k in keys)
              + f"  {b:6.0f}  {b / c['total']:6.2f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
