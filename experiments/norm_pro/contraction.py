#!/usr/bin/env python3
"""Which way NVRTC contracts norm.cu's sum of squares, read from static SASS (CPU; needs nvdisasm: pip
nvidia-cuda-nvdisasm). sumsq4 is `a.x * a.x + a.y * a.y + a.z * a.z + a.w * a.w`: with FMA contraction the first
add is either fma(x, x, y * y) or fma(y, y, x * x), two different roundings, and NVRTC picks one per call site and
unroll. The prologue of experiments/norm_pro (make.py) must make the same choice as the norm it replaces, so it pins
the one this scan finds. Disassembly: experiments/sass_loops.py (disassemble, instructions).

Per module (NORM_THREADS x NORM_MAXV) and kernel, each FFMA whose addend is an FMUL square is classified by the float4
component of its operands, traced from the LDG.128 that loaded them (site "load": a row read from memory) or through
the FADD that made them (site "sum": add_rmsnorm's x + d): "x_fma_y_mul" is fma(x, x, y * y).

    python3 experiments/norm_pro/contraction.py --out research/2026-12-04-session32/contraction.jsonl
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "experiments"))
from sass_loops import disassemble, instructions  # noqa: E402  (nvdisasm found in the pip package)


def classify(lines: list[str]) -> dict[str, int]:
    comp: dict[str, tuple[str, int]] = {}   # register -> (site, float4 component)
    squares: dict[str, tuple[str, int]] = {}  # FMUL x, x destinations -> the squared component
    out: dict[str, int] = {}
    for line in lines:
        line = re.sub(r"^@!?U?P\w+ ", "", line)
        m = re.match(r"([\w.]+) (.*?)\s*;?$", line)
        if not m:
            continue
        op, args = m.group(1), [a.strip() for a in m.group(2).split(",")]
        dst = args[0] if args and re.fullmatch(r"R\d+", args[0]) else None
        if dst is None:
            continue
        if op.startswith("LDG") and ".128" in op:
            k = int(dst[1:])
            for c in range(4):
                comp[f"R{k + c}"] = ("load", c)
            continue
        src = comp.get(args[1]) if len(args) > 1 else None
        if op == "FADD":
            hit = [comp[a] for a in args[1:3] if comp.get(a, ("", 0))[0] == "load"]
            comp.pop(dst, None)
            if hit:
                comp[dst] = ("sum", hit[0][1])
            continue
        if op == "FMUL" and args[1] == args[2] and src:
            squares[dst] = src
            comp.pop(dst, None)
            continue
        if op == "FFMA" and args[1] == args[2] and src and args[3] in squares:
            sq = squares.pop(args[3])
            if sq[0] == src[0] and {sq[1], src[1]} == {0, 1}:
                key = f"{src[0]}:{'x_fma_y_mul' if src[1] == 0 else 'y_fma_x_mul'}"
                out[key] = out.get(key, 0) + 1
        comp.pop(dst, None)
        squares.pop(dst, None)
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="contraction.jsonl")
    ap.add_argument("--threads", default="32,64,128,160,256,512,1024")
    ap.add_argument("--maxv", default="1,2,3,4,5,6,7,8")
    args = ap.parse_args()
    from memra.gpu.compile import source_hash

    with open(args.out, "w") as f:
        for t in (int(v) for v in args.threads.split(",")):
            for v in (int(v) for v in args.maxv.split(",")):
                sass = disassemble("norm.cu", {"NORM_THREADS": t, "NORM_MAXV": v})
                fs = {k: [text for _, _, _, text in instructions(sass, k)[0]] for k in ("rmsnorm", "add_rmsnorm")}
                for k in ("rmsnorm", "add_rmsnorm"):
                    rec = {"kind": "sass_contraction", "file": "norm.cu", "src_hash": source_hash("norm.cu"),
                           "arch": "sm_90a", "kernel": k, "NORM_THREADS": t, "NORM_MAXV": v, **classify(fs[k])}
                    f.write(json.dumps(rec) + "\n")
                    print(json.dumps(rec), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
