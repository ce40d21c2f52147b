#!/usr/bin/env python3
"""CPU evidence for attn_ring (no GPU): every variant of the ring (ATT_RING 2, 3) and attention.cu
itself (kernels/attention.cu, unedited; and make.py's copy at ATT_RING 0, which must give the same
SASS) through NVRTC (memra's options, sm_90a, ptxas -v): registers, spills, static and dynamic
shared memory, blocks an SM (H200: 64K registers, 228 KB shared memory with 1 KB reserved a block,
2048 threads), and SASS instruction counts of attn_decode_rope / attn_decode (nvdisasm): the float,
shuffle and special-function counts must match attention.cu's (same arithmetic); LDG of K/V
become LDGSTS + LDS.

    python3 experiments/attn_ring/cpu.py [--jobs 2] > experiments/attn_ring/cpu.txt
"""
from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT / "experiments" / "gemm_tile"))
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))
from make import make  # noqa: E402

BUILD = HERE / "build" / "attention.cu"
ORIG = ROOT / "kernels" / "attention.cu"
# (D, hpb, warps): the 8B (D 128, G 4), the 1B (D 64, G 4), SmolLM2 (D 64, G 3) at hpb 1, 2 and the
# group, 8 warps (session 16's table layout, check.py's), and head 64 at the built-in 4 warps
CASES = ((128, 1, 8), (128, 2, 8), (128, 4, 8), (64, 1, 8), (64, 2, 8), (64, 4, 8), (64, 3, 8),
         (64, 1, 4), (64, 4, 4), (64, 3, 4))
OPS = ("FFMA", "FMUL", "FADD", "FMNMX", "MUFU", "SHFL", "HADD2.F32", "LDG", "LDG.128", "LDGSTS", "LDS", "LDS.128", "STS", "STG",
       "BAR", "DEPBAR", "I2F", "F2F")
FNS = ("attn_decode_rope", "attn_decode")


def defs(D: int, hpb: int, w: int, ring) -> dict:
    """ring: None (kernels/attention.cu), 0..3 (make.py's copy at ATT_RING), or "lb" (the copy at
    ATT_RING 0 with ring.cuh's launch bounds of 2 heads a block, ATT_RING_MINB 2: the control for
    the ring variants that take them)."""
    d = {"HEAD_DIM": D, "N_GQA": hpb, "ATT_WARPS": w, "ATT_TILE": 64, "KV_BLOCK": 16}
    if ring == "lb":
        d.update(ATT_RING=0, ATT_RING_MINB=2)
    elif ring is not None:
        d["ATT_RING"] = ring
    return d


def nvdisasm() -> str:
    import shutil
    p = shutil.which("nvdisasm")
    if p:
        return p
    import nvidia
    for base in nvidia.__path__:
        for c in Path(base).glob("*/bin/nvdisasm"):
            return str(c)
    raise SystemExit("nvdisasm not found: pip install nvidia-cuda-nvdisasm")


def sass_counts(cubin: bytes, fn: str) -> Counter:
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        text = subprocess.run([nvdisasm(), "-c", f.name], capture_output=True, text=True, check=True).stdout
    sec = text.split(f".text.{fn}:")[1].split(".section")[0]
    c = Counter()
    for line in sec.splitlines():
        m = re.match(r"\s*/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?([A-Z0-9_.]+)", line)
        if not m:
            continue
        op = m.group(1)
        base = op.split(".")[0]
        c["total"] += 1
        if op.startswith("HADD2.F32"):
            c["HADD2.F32"] += 1
        if base in ("LDG", "LDS") and ".128" in op:
            c[base + ".128"] += 1
        c[base] += 1
    return c


def info(log: str, fn: str) -> dict:
    part = log.split(f"Compiling entry function '{fn}'")[1].split("Compiling entry function")[0]
    regs = int(re.search(r"Used (\d+) registers", part).group(1))
    sp = re.search(r"(\d+) bytes spill stores", part)
    sm = re.search(r"(\d+) bytes smem", part)
    return {"regs": regs, "spill": int(sp.group(1)) if sp else 0, "smem": int(sm.group(1)) if sm else 0}


def blocks_per_sm(regs: int, nt: int, smem: int) -> dict:
    warps = nt // 32
    by_regs = 65536 // (warps * ((regs * 32 + 255) // 256 * 256))
    by_smem = 233472 // (smem + 1024)
    by_thr = 2048 // nt
    return {"by_regs": by_regs, "by_smem": by_smem, "blocks": min(by_regs, by_smem, by_thr, 32)}


def one(item):
    from tile import compile_module
    D, hpb, w, ring = item
    d = defs(D, hpb, w, ring)
    cub, log = compile_module(d, ORIG if ring is None else BUILD)
    out = {"D": D, "hpb": hpb, "w": w, "ring": ring, "nt": d["ATT_WARPS"] * 32}
    for fn in FNS:
        r = info(log, fn)
        dyn = (ring if isinstance(ring, int) else 0) * 2 * 64 * D * 2
        r["dyn"] = dyn
        r.update(blocks_per_sm(r["regs"], out["nt"], r["smem"] + dyn))
        r["sass"] = dict(sass_counts(cub, fn))
        out[fn] = r
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=2)
    args = ap.parse_args()
    make(BUILD)
    items = [(D, h, w, r) for D, h, w in CASES for r in (None, 2, 3)] + [(128, 1, 8, 0)]
    items += [(D, h, w, "lb") for D, h, w in CASES if h == 2]
    with ProcessPoolExecutor(args.jobs) as ex:
        res = list(ex.map(one, items))
    by = {(r["D"], r["hpb"], r["w"], r["ring"]): r for r in res}
    print("# registers / spills / smem (static + dynamic) / blocks an SM; attention.cu = kernels/attention.cu")
    print(f"{'D':>4} {'hpb':>3} {'w':>2} {'variant':>14} | {'fn':16} {'regs':>4} {'spill':>5} {'static':>6} {'dyn':>6} "
          f"{'blk/SM':>6} (regs, smem)")
    for r in res:
        name = "attention.cu" if r["ring"] is None else "attn.cu+LB2" if r["ring"] == "lb" else f"ATT_RING={r['ring']}"
        for fn in FNS:
            x = r[fn]
            print(f"{r['D']:>4} {r['hpb']:>3} {r['w']:>2} {name:>14} | {fn:16} {x['regs']:>4} {x['spill']:>5} {x['smem']:>6} "
                  f"{x['dyn']:>6} {x['blocks']:>6} ({x['by_regs']}, {x['by_smem']})")
    print("\n# SASS counts (attn_decode_rope | attn_decode), ring vs attention.cu")
    for D, h, w in CASES:
        for fn in FNS:
            base = by[(D, h, w, None)][fn]["sass"]
            print(f"D {D} hpb {h} warps {w} {fn}:")
            for ring in (None, 2, 3):
                s = by[(D, h, w, ring)][fn]["sass"]
                print(f"   {('attention.cu' if ring is None else 'ring ' + str(ring)):>12}: " +
                      " ".join(f"{op}={s.get(op, 0)}" for op in OPS + ("total",)))
            if h == 2:  # the ring takes ATT_RING_MINB 2 here: compare with attention.cu under the same bounds
                lb = by[(D, h, w, "lb")][fn]["sass"]
                print(f"   {'attn.cu+LB2':>12}: " + " ".join(f"{op}={lb.get(op, 0)}" for op in OPS + ("total",)))
            for ring in (2, 3):
                s = by[(D, h, w, ring)][fn]["sass"]
                fl = ("FFMA", "FMUL", "FADD", "FMNMX", "MUFU", "SHFL", "HADD2.F32")
                same = all(s.get(op, 0) == base.get(op, 0) for op in fl)
                line = f"   ring {ring}: float/MUFU/SHFL counts {'SAME' if same else 'DIFFER'} as attention.cu"
                if h == 2:
                    same_lb = all(s.get(op, 0) == lb.get(op, 0) for op in fl)
                    line += f"; {'SAME' if same_lb else 'DIFFER'} as attention.cu under the same launch bounds"
                print(line)
    z = by[(128, 1, 8, 0)]
    o = by[(128, 1, 8, None)]
    print("\n# make.py's copy at ATT_RING=0 vs kernels/attention.cu (D 128, hpb 1): SASS counts "
          + ("identical" if all(z[f]["sass"] == o[f]["sass"] for f in FNS) else "DIFFER"))
    (HERE / "build").mkdir(exist_ok=True)
    (HERE / "build" / "cpu.json").write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
