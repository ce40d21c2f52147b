#!/usr/bin/env python3
"""sass_identity: gemm.cu modules of two kernel trees must disassemble identically (nvdisasm, sm_90a).

    python3 experiments/gemm_v9/sass_identity.py OLD_KERNELS_DIR NEW_KERNELS_DIR KC_LOG
KC_LOG: the log of `python3 -m memra kernel-check --compile-only --arch sm_90a --only gemm` (its
'PASS gemm compile sm_90a gemm.cu -D...' lines name the modules). Each module is compiled with
memra.gpu.compile.compile_cubin(use_cache=False) -- memra's own NVRTC options -- with
memra.gpu.compile.kernel_dir pointed at each tree in turn, and `nvdisasm -c` of the cubins compared.
"""
from __future__ import annotations

import re
import subprocess
import sys
import tempfile
from pathlib import Path

import memra.gpu.compile as mc


def cubin(kdir: Path, defs: dict) -> bytes:
    orig = mc.kernel_dir
    mc.kernel_dir = lambda: kdir
    try:
        return mc.compile_cubin("gemm.cu", "sm_90a", defs, use_cache=False)
    finally:
        mc.kernel_dir = orig


def sass(cub: bytes) -> str:
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cub)
        f.flush()
        return subprocess.run(["nvdisasm", "-c", f.name], capture_output=True, text=True, check=True).stdout


def main() -> int:
    old, new, log = Path(sys.argv[1]).resolve(), Path(sys.argv[2]).resolve(), Path(sys.argv[3])
    mods = []
    for line in log.read_text().splitlines():
        m = re.search(r"compile sm_90a gemm\.cu ((?:-D\S+ ?)+)", line)
        if m:
            d = dict(t[2:].split("=", 1) for t in m.group(1).split())
            if d not in mods:
                mods.append(d)
    same = diff = 0
    for defs in mods:
        ok = sass(cubin(old, defs)) == sass(cubin(new, defs))
        same += ok
        diff += not ok
        print(("SAME " if ok else "DIFF ") + " ".join(f"-D{k}={v}" for k, v in sorted(defs.items())), flush=True)
    print(f"{same} identical, {diff} different (of {len(mods)} modules)")
    return 1 if diff or not mods else 0


if __name__ == "__main__":
    sys.exit(main())
