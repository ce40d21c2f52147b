#!/usr/bin/env python3
"""sass: registers, spills, shared memory and static SASS per IMMA of gemm_tile.cu (CPU, sm_90a).

Compiles through tile.py's compile (memra's NVRTC options + ptxas -v), disassembles with
nvdisasm (PATH, or the pip wheel's nvidia/cu13/bin) and counts, by experiments/gemm_v9's
instruction classes, the warp instructions of one K stage (256 k = 8 k32 blocks, 16 IMMAs
each for a 64 x 32 warp tile): the stage loop (the loop holding the IMMAs' loop) with its
inner j loop weighted by its trip count (8 k32 blocks / the k32 blocks one pass holds).
Per IMMA, so it compares with gemm_v9's "total / IMMA" (gemm.cu's unit loop + its merge).

    python3 experiments/gemm_tile/sass.py                         # the README's table
    python3 experiments/gemm_tile/sass.py GT_WM=2 GT_WN=2 [FN=gemm_tile]
"""
from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT / "experiments" / "mvt"))
import sass_count as scount  # noqa: E402  (disasm, regs, opcode, classify)
import tile  # noqa: E402

_EXTRA = {"IMMA": ("HMMA", r"^HMMA"), "STS": ("LDG", r"^LDG")}   # the TF32 min term; register-staged weights
CLASSES = tuple(x for c in scount.GEMM_CLASSES for x in (c,) + ((_EXTRA[c[0]],) if c[0] in _EXTRA else ()))
KEYS = [k for k, _ in CLASSES] + ["other", "total"]


loops = scount.loops


def stage(ins):
    """(class counts of one K stage, IMMAs in it): the innermost IMMA loop x its trips + the rest
    of the loop enclosing it (or the IMMA loop alone when the j loop is fully unrolled)."""
    lp = loops(ins)
    imma = [i for i, s in enumerate(ins) if "IMMA" in s]
    with_imma = [(h, b) for h, b in lp if any(h < i < b for i in imma)]
    inner = min(with_imma, key=lambda hb: hb[1] - hb[0])
    n_in = sum(1 for i in range(*inner) if "IMMA" in ins[i])
    outer = [(h, b) for h, b in with_imma if h < inner[0] and inner[1] < b]
    seg_in = [ins[i] for i in range(inner[0], inner[1] + 1)]
    c_in = scount.classify(seg_in, CLASSES)
    if n_in >= 128 or not outer:      # the stage loop itself
        return c_in, n_in, 1
    o = min(outer, key=lambda hb: hb[1] - hb[0])
    trips = 128 // n_in
    seg_out = [ins[i] for i in range(o[0], o[1] + 1) if not inner[0] <= i <= inner[1]]
    c_out = scount.classify(seg_out, CLASSES)
    n_out = sum(1 for s in seg_out if "IMMA" in s)
    return {k: trips * c_in[k] + c_out[k] for k in c_in}, trips * n_in + n_out, trips


TABLE = (
    ("glu 2,4,3 (BM 128, BN 128)", {"GT_WM": 2, "GT_WN": 4, "GT_STAGES": 3}, "gemm_tile_glu"),
    ("plain 2,4,3", {"GT_WM": 2, "GT_WN": 4, "GT_STAGES": 3}, "gemm_tile"),
    ("glu 2,2,3 (BM 128, BN 64)", {"GT_WM": 2, "GT_WN": 2, "GT_STAGES": 3}, "gemm_tile_glu"),
    ("glu 1,4,4 (BM 64, BN 128)", {"GT_WM": 1, "GT_WN": 4, "GT_STAGES": 4}, "gemm_tile_glu"),
    ("glu 4,2,2 (BM 256, BN 64)", {"GT_WM": 4, "GT_WN": 2, "GT_STAGES": 2}, "gemm_tile_glu"),
    ("glu 2,4,3 tc (GT_MINTC)", {"GT_WM": 2, "GT_WN": 4, "GT_STAGES": 3, "GT_MINTC": 1}, "gemm_tile_glu"),
    ("plain 2,4,3 tc", {"GT_WM": 2, "GT_WN": 4, "GT_STAGES": 3, "GT_MINTC": 1}, "gemm_tile"),
    ("glu 2,2,3 tc", {"GT_WM": 2, "GT_WN": 2, "GT_STAGES": 3, "GT_MINTC": 1}, "gemm_tile_glu"),
    ("glu 2,4,3 tcm (+GT_MAGIC)", {"GT_WM": 2, "GT_WN": 4, "GT_STAGES": 3, "GT_MINTC": 1, "GT_MAGIC": 1}, "gemm_tile_glu"),
    ("plain 2,4,3 tcm", {"GT_WM": 2, "GT_WN": 4, "GT_STAGES": 3, "GT_MINTC": 1, "GT_MAGIC": 1}, "gemm_tile"),
    ("glu 2,2,3 tcm", {"GT_WM": 2, "GT_WN": 2, "GT_STAGES": 3, "GT_MINTC": 1, "GT_MAGIC": 1}, "gemm_tile_glu"),
    ("glu 2,4,3 j unrolled x2", {"GT_WM": 2, "GT_WN": 4, "GT_STAGES": 3, "GT_JUNROLL": 2}, "gemm_tile_glu"),
    ("glu 2,4,3 j unrolled x4", {"GT_WM": 2, "GT_WN": 4, "GT_STAGES": 3, "GT_JUNROLL": 4}, "gemm_tile_glu"),
)


def main() -> int:
    rows = TABLE
    if len(sys.argv) > 1:
        d = dict(a.split("=", 1) for a in sys.argv[1:])
        fn = d.pop("FN", "gemm_tile_glu")
        rows = [(" ".join(sys.argv[1:]), {k: int(v) for k, v in d.items()}, fn)]
    print(f"{'module':30s} regs spill  smem  instrs | per IMMA: " + " ".join(f"{k:>6s}" for k in KEYS))
    for name, defs, fn in rows:
        cub, log = tile.compile_module(defs)
        r, sp = scount.regs(log, fn)
        ins = scount.disasm(cub, fn)
        ntot = sum(1 for s in ins if not s.startswith(".L") and scount.opcode(s) != "NOP")
        c, nimma, trips = stage(ins)
        smem = tile.smem_bytes(defs)
        print(f"{name:30s} {r:4d} {sp:5d} {smem:6d} {ntot:6d} | " + " ".join(f"{c[k] / nimma:6.2f}" for k in KEYS)
              + f"   ({nimma} IMMA a stage, j loop x{trips})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
