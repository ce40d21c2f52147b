#!/usr/bin/env python3
"""sass.py — static SASS of chain_mv.cu's loops beside mv_q8's (kernels/matvec.cu), per 32 weights.

    PYTHONPATH=. python3 experiments/chain_mv/sass.py

Compiles both through NVRTC (sm_90a, c++17, -I kernels, ptxas -v), disassembles with nvdisasm
(experiments/mvt/sass_count.py's helpers) and lists every loop (a label and its last back-edge)
with its instruction classes. The per-32-weight figure is thread instructions per (row, k32 block)
pair at batch 1 (= warp instructions per 32 such pairs):
  mv_q8:    the unit loop (IDP4A inside) covers 2 k32 blocks x MV_ROWS rows x (unroll) units a lane;
  chain_mv: the loader loop (one tile) covers 2 k32 blocks x CM_RPW rows a lane; the chain warp's
            full-tile loop (FFMA, no IDP4A) covers 64 blocks of its 32 chains per 32 ... i.e.
            (instructions x trips) / 64 per 32 pairs, added to the loaders' figure.
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT / "experiments" / "mvt"))
sys.path.insert(0, str(ROOT / "experiments" / "gemm_tile"))
sys.path.insert(0, str(ROOT))
import sass_count as SC  # noqa: E402  (nvdisasm on PATH, disasm, loops, classify)
import tile as T  # noqa: E402  (compile_module)

CLASSES = (("IDP4A", r"^IDP"), ("LDG", r"^LDG"), ("LDS", r"^LDS"), ("STS", r"^STS"), ("I2F", r"^I2F"),
           ("FFMA", r"^FFMA"), ("FMUL", r"^FMUL"), ("FADD", r"^FADD"), ("SHFL", r"^SHFL"), ("BAR", r"^BAR"),
           ("BRA", r"^(BRA|BSSY|BSYNC|EXIT|WARPSYNC)"),
           ("intALU", r"^(LOP3|SHF|IADD3|IMAD|PRMT|SGXT|BMSK|ISETP|LEA|SEL|IMNMX|VIADD|VIMNMX|PLOP3|FSEL|FSETP|UIADD3|ULOP3|USHF|UIMAD|ULEA|USEL|UISETP|UMOV|ULDC|S2R|S2UR|R2UR|P2R|R2P)"),
           ("MOV", r"^(MOV|CS2R)"))


def info(log: str, fn: str) -> tuple[int, int, int]:
    part = log.split(f"Compiling entry function '{fn}'")[1]
    r = int(re.search(r"Used (\d+) registers", part).group(1))
    sp = re.search(r"(\d+) bytes spill stores", part)
    sm = re.search(r"(\d+) bytes smem", part)
    return r, int(sp.group(1)) if sp else 0, int(sm.group(1)) if sm else 0


def loop_table(ins):
    out = []
    for h, be in SC.loops(ins):
        seg = ins[h:be + 1]
        out.append((h, be, SC.classify(seg, CLASSES)))
    return out


def fmt(c):
    return " ".join(f"{k} {v}" for k, v in c.items() if v)


def main() -> int:
    rows = []
    mv_defs = {"MV_TYPE": 12, "MV_B": 1, "MV_NWARPS": 4, "MV_ROWS": 2, "MV_UNROLL": 2}   # the H200 table's 4096x14336 entry
    cub, log = T.compile_module(mv_defs, ROOT / "kernels" / "matvec.cu")
    r, sp, sm = info(log, "mv_q8")
    ins = SC.disasm(cub, "mv_q8")
    print(f"mv_q8 {mv_defs}: {r} regs, {sp} B spill")
    best = None
    for h, be, c in loop_table(ins):
        print(f"  loop [{h}, {be}]: {c['total']} instr: {fmt(c)}")
        if c["IDP4A"] and (best is None or c["IDP4A"] > best["IDP4A"]):
            best = c
    # the unrolled body: IDP4A / 16 units (16 dp4a a unit and row) ; per (row, k32 block): / 2
    units = best["IDP4A"] // 16
    mv_per32 = best["total"] / (2 * units)
    print(f"  unit loop: {best['total']} instr for {units} (row, unit)s -> {mv_per32:.1f} thread instr per (row, k32 block)")
    rows.append(("mv_q8 " + ",".join(f"{k}={v}" for k, v in mv_defs.items() if k != "MV_TYPE"), r, sp, mv_per32, best))
    V2 = {"CM_V2": 1}
    for defs in ({"CM_NW": 8}, {"CM_NW": 16}, {"CM_NW": 16, "CM_CR": 16}, {"CM_NW": 8, "CM_PF": 0}, {"CM_NW": 8, "CM_FAST": 0},
                 {**V2, "CM_NW": 8}, {**V2, "CM_NW": 8, "CM_CR": 16, "CM_MINB": 2},
                 {**V2, "CM_ASYNC": 1, "CM_NW": 8, "CM_CR": 16, "CM_PF": 2, "CM_MINB": 2},
                 {**V2, "CM_ASYNC": 1, "CM_NW": 8, "CM_CR": 16, "CM_PF": 1, "CM_MINB": 3},
                 {**V2, "CM_ASYNC": 1, "CM_NW": 8, "CM_CR": 32, "CM_PF": 2},
                 {**V2, "CM_ASYNC": 1, "CM_NW": 8, "CM_CR": 8, "CM_PF": 2, "CM_MINB": 4},
                 {**V2, "CM_ASYNC": 1, "CM_XS": 1, "CM_NW": 8, "CM_CR": 16, "CM_PF": 2, "CM_MINB": 2},
                 {**V2, "CM_ASYNC": 1, "CM_NW": 8, "CM_CR": 16, "CM_PF": 2, "CM_MINB": 2, "CM_GLU": 1}):
        cub, log = T.compile_module(defs, HERE / "chain_mv.cu")
        r, sp, sm = info(log, "chain_mv")
        ins = SC.disasm(cub, "chain_mv")
        nw = defs["CM_NW"]
        cr = defs.get("CM_CR", 32)
        rpw = -(-cr // nw)
        print(f"chain_mv {defs}: {r} regs, {sp} B spill, {sm} B smem")
        ld = ch = None
        for h, be, c in loop_table(ins):
            print(f"  loop [{h}, {be}]: {c['total']} instr: {fmt(c)}")
            if c["IDP4A"]:
                ld = c if ld is None or c["total"] > ld["total"] else ld
            elif c["FFMA"] >= 8 and not c["IDP4A"]:
                ch = c if ch is None or c["FFMA"] > ch["FFMA"] else ch
        # v2 unrolls the loader loop by CM_PF + 1 steps: the steps a trip = IDP4A / (16 x rows a lane)
        steps = ld["IDP4A"] / (16 * rpw)
        ld_per32 = ld["total"] / steps / (2 * rpw)
        # chain loop: c['FFMA'] / 2 blocks per trip, 64 blocks a tile: trips = 64 / (FFMA / 2)
        trips = 64 / (ch["FFMA"] / 2)
        ch_tile = ch["total"] * trips
        # loaders: NW warps x 32 lanes x rpw rows x 2 blocks = 64 x 32 ... pairs a tile; the chain: cr x 64 pairs
        ch_per32 = ch_tile / (cr * 64 / 32) * (cr / 32) if cr else 0
        ch_per32 = ch_tile / 64 if cr == 32 else ch_tile / (cr * 64 / 32)   # warp instr per 32 pairs
        tot = ld_per32 + ch_per32
        print(f"  loader tile: {ld['total']} instr / {steps:.0f} steps / (2 x {rpw} rows) = {ld_per32:.1f}; chain tile {ch_tile:.0f} instr "
              f"for {cr} chains x 64 blocks = {ch_per32:.2f} per 32 pairs; total {tot:.1f} per (row, k32 block)")
        rows.append(("chain_mv " + ",".join(f"{k}={v}" for k, v in defs.items()), r, sp, tot, ld))
    print(f"\n{'module':90s} {'regs':>4s} {'spill':>5s} {'instr / (row, k32)':>18s}")
    for n, r, sp, t, _ in rows:
        print(f"{n:90s} {r:4d} {sp:5d} {t:18.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
