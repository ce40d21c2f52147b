#!/usr/bin/env python3
"""sass2: registers, spills, shared memory and static SASS per IMMA of gemm_tile2.cu's K loop (CPU,
sm_90a), beside gemm_tile.cu's "2,4,3 tcm"; plus a proxy for short_scoreboard stalls: for each shared
load (LDS / LDSM) of the stage loop, the distance in instructions (in program order, wrapping around
the loop's back edge) to the first instruction that reads one of its destination registers.

    python3 experiments/gemm_tile2/sass2.py                 # the README's table
    python3 experiments/gemm_tile2/sass2.py GT_FORM=1 GT_PF=2 [FN=gemm_tile]

Counting as experiments/gemm_tile/sass.py (its stage(): the stage loop, an inner pair loop weighted
by its trips), classes of experiments/mvt/sass_count.py plus HMMA, LDG and STL / LDL (spills).
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT / "experiments" / "gemm_tile"))
sys.path.insert(0, str(ROOT / "experiments" / "mvt"))
import sass_count as scount  # noqa: E402
import sass as tsass  # noqa: E402  (gemm_tile's stage(), CLASSES)
import tile2  # noqa: E402

CLASSES = tsass.CLASSES + (("LDL/STL", r"^(LDL|STL)"),)
KEYS = [k for k, _ in CLASSES] + ["other", "total"]
WIDTH = {".128": 4, ".64": 2}


def _regs(op: str) -> list[int]:
    return [int(x) for x in re.findall(r"\bR(\d+)\b", op)]


def src_regs(s: str) -> set[int]:
    """Registers an instruction reads (operand widths by opcode: IMMA / HMMA A 4, B 2, C 4; STS.128 4 ...)."""
    body = re.sub(r"^@!?U?P\w+\s+", "", s.strip())
    op, _, rest = body.partition(" ")
    ops = [o.strip() for o in rest.split(",")]
    out = set()
    if op.startswith(("IMMA", "HMMA")):
        widths = (4, 4, 2, 4)   # D, A, B, C
        for o, w in zip(ops[1:], widths[1:]):
            for r in _regs(o):
                out.update(range(r, r + w))
        return out
    stores = op.startswith(("STS", "STG", "STL", "ST.", "BAR", "LDGSTS", "RED", "ATOM"))
    first = 0 if stores else 1
    w = next((v for k, v in WIDTH.items() if k in op), 1)
    for i, o in enumerate(ops[first:]):
        if "[" in o:   # address registers
            for r in _regs(o):
                out.add(r)
            continue
        for r in _regs(o):
            out.update(range(r, r + (w if stores else 1)))
    return out


def dst_regs(s: str) -> set[int]:
    body = re.sub(r"^@!?U?P\w+\s+", "", s.strip())
    op, _, rest = body.partition(" ")
    d = rest.split(",")[0]
    rr = _regs(d)
    if not rr:
        return set()
    w = 4 if op.startswith("LDSM") and ".4" in op else 2 if op.startswith("LDSM") and ".2" in op else \
        next((v for k, v in WIDTH.items() if k in op), 1)
    return set(range(rr[0], rr[0] + w))


def use_distance(ins: list[str]) -> list[int]:
    """For each LDS / LDSM of the stage loop: instructions until the first reader of its result, scanning
    forward in the innermost loop holding the load and wrapping around that loop's back edge."""
    lp = scount.loops(ins)
    imma = [i for i, s in enumerate(ins) if "IMMA" in s]
    with_imma = [(h, b) for h, b in lp if any(h < i < b for i in imma)]
    H, B = max(with_imma, key=lambda hb: hb[1] - hb[0])   # the stage loop
    out = []
    for i in range(H, B + 1):
        s = ins[i]
        if s.startswith(".L") or not re.match(r"^LDS(M|\.|$)", scount.opcode(s)):
            continue
        h, b = min(((h, b) for h, b in lp if h <= i <= b), key=lambda hb: hb[1] - hb[0])
        body = [k for k in range(h, b + 1) if not ins[k].startswith(".L")]
        pos = body.index(i)
        d = dst_regs(s)
        dist = len(body)
        for k in range(1, len(body)):
            t = ins[body[(pos + k) % len(body)]]
            if src_regs(t) & d:
                dist = k
                break
        out.append((dist, scount.opcode(s), i))
    return out


def weighted_near(ins: list[str], dist: list, ks=(8, 16, 32)) -> tuple[float, list[float]]:
    """Shared-load executions a stage and the fraction of them consumed within k instructions: a load in
    the pair loop (GT_PU 1) counts its trips, one in a once-a-stage block (conditional()) once."""
    lp = scount.loops(ins)
    imma = [i for i, s in enumerate(ins) if "IMMA" in s]
    with_imma = [(h, b) for h, b in lp if any(h < i < b for i in imma)]
    inner = min(with_imma, key=lambda hb: hb[1] - hb[0])
    n_in = sum(1 for i in range(*inner) if "IMMA" in ins[i])
    trips = 1 if n_in >= 128 else 128 // n_in
    cond = conditional(ins, *inner) if trips > 1 else set()
    w = [(trips if inner[0] <= i <= inner[1] and i not in cond else 1) for _, _, i in dist]
    tot = sum(w)
    return tot, [sum(wi for wi, (d, _, _) in zip(w, dist) if d <= k) / tot for k in ks]


def conditional(ins: list[str], h: int, b: int) -> set[int]:
    """Indices inside loop (h, b) skipped by a forward branch to a label inside the loop (the pair
    loop's once-a-stage blocks: the refill / barrier, the scalar pass, the min term)."""
    labels = {ins[i].rstrip(":"): i for i in range(h, b + 1) if ins[i].startswith(".L")}
    out = set()
    for i in range(h + 1, b):
        m = re.search(r"\bBRA\b.*\((\.L\w+)\)", ins[i])
        if m and m.group(1) in labels and labels[m.group(1)] > i:
            out.update(range(i + 1, labels[m.group(1)]))
    return out


def stage(ins):
    lp = scount.loops(ins)
    imma = [i for i, s in enumerate(ins) if "IMMA" in s]
    with_imma = [(h, b) for h, b in lp if any(h < i < b for i in imma)]
    inner = min(with_imma, key=lambda hb: hb[1] - hb[0])
    n_in = sum(1 for i in range(*inner) if "IMMA" in ins[i])
    outer = [(h, b) for h, b in with_imma if h < inner[0] and inner[1] < b]
    c_in = scount.classify([ins[i] for i in range(inner[0], inner[1] + 1)], CLASSES)
    if n_in >= 128 or not outer:
        return c_in, n_in, 1
    o = min(outer, key=lambda hb: hb[1] - hb[0])
    trips = 128 // n_in
    # the pair loop's once-a-stage blocks (GT_PU 1) count once, not trips times
    cond = conditional(ins, *inner)
    c_always = scount.classify([ins[i] for i in range(inner[0], inner[1] + 1) if i not in cond], CLASSES)
    c_once = scount.classify([ins[i] for i in sorted(cond)], CLASSES)
    c_in = {k: c_always[k] + c_once[k] / trips for k in c_always}
    seg_out = [ins[i] for i in range(o[0], o[1] + 1) if not inner[0] <= i <= inner[1]]
    c_out = scount.classify(seg_out, CLASSES)
    n_out = sum(1 for s in seg_out if "IMMA" in s)
    return {k: trips * c_in[k] + c_out[k] for k in c_in}, trips * n_in + n_out, trips


VERBOSE = False


def main() -> int:
    global VERBOSE
    if "-v" in sys.argv:
        VERBOSE = True
        sys.argv.remove("-v")
    rows = tile2.SASS_TABLE
    if len(sys.argv) > 1:
        d = dict(a.split("=", 1) for a in sys.argv[1:])
        fn = d.pop("FN", "gemm_tile_glu")
        rows = [(" ".join(sys.argv[1:]), "tile2", {k: int(v) for k, v in d.items()}, fn)]
    print(f"{'module':34s} regs spill   smem | per IMMA: " + " ".join(f"{k:>7s}" for k in KEYS)
          + " | shared loads a IMMA, fraction used within 8 / 16 / 32 instructions")
    for name, src, defs, fn in rows:
        cub, log = tile2.compile_module(src, defs)
        r, sp = scount.regs(log, fn)
        ins = scount.disasm(cub, fn)
        c, nimma, trips = stage(ins)
        dist = use_distance(ins)
        tot, near = weighted_near(ins, dist)
        smem = tile2.smem_bytes(src, defs)
        print(f"{name:34s} {r:4d} {sp:5d} {smem:6d} | " + " ".join(f"{c[k] / nimma:7.2f}" for k in KEYS)
              + f" | {tot / nimma:.2f} a IMMA: {' / '.join(f'{x:.2f}' for x in near)}   ({nimma} IMMA a stage, loop x{trips})", flush=True)
        if VERBOSE:
            for d, op, i in dist:
                if d <= 32:
                    print(f"    {op:16s} at {i}: used after {d}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
