#!/usr/bin/env python3
"""sass_loops: the static SASS of a kernel's longest loop (its main loop) — instruction classes and,
with --lines, the non-FFMA / IMMA / HMMA instructions per source line. NVRTC here, nvdisasm from
PyPI's nvidia-cuda-nvdisasm; no GPU.

    python3 experiments/sass_loops.py attn_fa.cu attn_fa HEAD_DIM=128 FA_WARPS=8 FA_SPLIT=4096 KV_BLOCK=16
    python3 experiments/sass_loops.py kernels/attn_fa.cu attn_fa HEAD_DIM=128 FA_WARPS=8 \
        FA_SPLIT=4096 KV_BLOCK=16 --fold 'const float v = softcap > 0.f::const float v = false'
    python3 experiments/sass_loops.py gemm_tile.cu gemm_tile_glu --tile 12 --lines
    python3 experiments/sass_loops.py gemm.cu gemm_q8_glu MV_TYPE=12 --all     # every loop, innermost first

A kernel file is a name under kernels/ or a path; --fold 'A::B' compiles a copy with text A replaced by
B (to count one path of a runtime branch: research/2026-12-03-session20 folded softcap to false and
attn_fa v7's whole-tile test each way); --tile T takes memra.gpu.ops.gemm_tile's 512-row defines of
type T."""
from __future__ import annotations

import argparse
import collections
import glob
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def nvdisasm() -> str:
    import nvidia

    for base in nvidia.__path__:
        hits = glob.glob(os.path.join(base, "**", "bin", "nvdisasm"), recursive=True)
        if hits:
            return hits[0]
    raise SystemExit("nvdisasm not found: pip install nvidia-cuda-nvdisasm")


def disassemble(src: str, defines: dict, arch: str = "sm_90a") -> str:
    from memra.gpu import compile as C

    cub, _ = C._nvrtc(src, C.options_for(arch, defines))
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cub)
        f.flush()
        return subprocess.run([nvdisasm(), "-c", "-g", f.name], capture_output=True, text=True, check=True).stdout


def instructions(sass: str, entry: str):
    """(address, opcode class, source 'file:line', text) of `entry`, and its labels' addresses."""
    on, line, ins, labels, pend = False, None, [], {}, []
    for raw in sass.split("\n"):
        st = raw.strip()
        if st.startswith(f".text.{entry}:"):
            on = True
            continue
        if on and st.startswith(".text.") and st.endswith(":"):
            break
        if not on:
            continue
        m = re.search(r'//## File "(?:.*/)?([\w.]+)", line (\d+)', raw)
        if m:
            line = f"{m.group(1)}:{m.group(2)}"
            continue
        m = re.match(r"\.L_x_(\d+):", st)
        if m:
            pend.append(m.group(1))
            continue
        m = re.match(r"\s*/\*([0-9a-f]{4,})\*/\s+(.*?);", raw)
        if m:
            a = int(m.group(1), 16)
            for p in pend:
                labels[p] = a
            pend = []
            t = m.group(2).strip()
            ins.append((a, re.sub(r"^@!?U?P\w+\s+", "", t).split()[0].split(".")[0], line, t))
    if not ins:
        raise SystemExit(f"no function {entry!r} in the module")
    return ins, labels


def all_loops(ins, labels):
    """(start, end, instructions) of every backward branch's loop, smallest first."""
    out = []
    for a, op, _, t in ins:
        m = re.search(r"\.L_x_(\d+)", t) if op == "BRA" else None
        if m and labels.get(m.group(1), 1 << 40) < a:
            lo = labels[m.group(1)]
            out.append((lo, a, [x for x in ins if lo <= x[0] <= a]))
    return sorted(out, key=lambda x: len(x[2]))


def main_loop(ins, labels):
    """The loop spanning the most addresses (the kernel's main loop)."""
    loops = all_loops(ins, labels)
    if not loops:
        raise SystemExit("no backward branch: no loop")
    return max(loops, key=lambda x: x[1] - x[0])[2]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("src")
    ap.add_argument("entry")
    ap.add_argument("defines", nargs="*", help="NAME=VALUE")
    ap.add_argument("--tile", type=int, help="gemm_tile.cu's 512-row defines of this ggml type")
    ap.add_argument("--fold", action="append", default=[], help="'A::B': compile with text A replaced by B")
    ap.add_argument("--lines", action="store_true", help="the loop's instructions per source line")
    ap.add_argument("--all", action="store_true", help="every loop (each backward branch), innermost first")
    a = ap.parse_args()
    defines = dict(kv.split("=", 1) for kv in a.defines)
    if a.tile:
        from memra.gpu.ops import gemm_tile as GT

        defines = {**GT.MV.type_defines(a.tile, GT.launch_config(a.tile, 512)), **defines}
    src = a.src if "/" not in a.src else str(Path(a.src).resolve())
    tmp = None
    if a.fold:
        text = (ROOT / "kernels" / src).read_text() if "/" not in src else Path(src).read_text()
        for f in a.fold:
            old, new = f.split("::", 1)
            if old not in text:
                raise SystemExit(f"--fold: {old!r} is not in {a.src}")
            text = text.replace(old, new)
        tmp = tempfile.NamedTemporaryFile("w", suffix=".cu", delete=False)
        tmp.write(text)
        tmp.close()
        src = tmp.name
    try:
        ins, labels = instructions(disassemble(src, defines), a.entry)
    finally:
        if tmp:
            os.unlink(tmp.name)
    if a.all:
        for lo, hi, body in all_loops(ins, labels):
            c = collections.Counter(x[1] for x in body)
            mma = c["IMMA"] + c["HMMA"]
            print(f"  loop {lo:#x}..{hi:#x}: {len(body)} instructions, {mma} MMA"
                  f"{f' ({len(body) / mma:.1f} an MMA)' if mma else ''}: "
                  + ", ".join(f"{k} {v}" for k, v in c.most_common(12)))
        return 0
    loop = main_loop(ins, labels)
    c = collections.Counter(x[1] for x in loop)
    mma = c["IMMA"] + c["HMMA"]
    print(f"{a.src} {a.entry} {defines}: loop {hex(loop[0][0])}..{hex(loop[-1][0])}, {len(loop)} instructions, "
          f"{mma} MMA ({len(loop) / max(mma, 1):.1f} an MMA)")
    print("  " + ", ".join(f"{k} {v}" for k, v in c.most_common(24)))
    if a.lines:
        by = collections.defaultdict(collections.Counter)
        for _, op, ln, _ in loop:
            by[ln][op] += 1
        rest = lambda cc: sum(v for k, v in cc.items() if k not in ("FFMA", "IMMA", "HMMA"))  # noqa: E731
        for ln, cc in sorted(by.items(), key=lambda kv: -rest(kv[1])):
            if rest(cc) >= 4:
                print(f"  {rest(cc):4d} {ln}: {dict(cc.most_common(5))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
