#!/usr/bin/env python3
"""sass_identity: modules of one kernel file compiled from two kernel trees must disassemble
identically (nvdisasm, sm_90a) — how a variant behind a default-off define shows it leaves the
default modules untouched.

    python3 experiments/sass_identity.py OLD_KERNELS_DIR NEW_KERNELS_DIR MODULES [KERNEL]
MODULES: a `python3 -m memra kernel-check --compile-only --arch sm_90a [--only F]` log (its
'compile sm_90a <file>.cu -D...' lines name the modules and their file), or one module a line as
'-DK=V -DK=V ...' with KERNEL (e.g. mvt.cu). Each module is compiled by
memra.gpu.compile.compile_cubin(use_cache=False) — memra's own NVRTC options — with
memra.gpu.compile.kernel_dir pointed at each tree in turn, and `nvdisasm -c` of the cubins compared.
"""
from __future__ import annotations

import re
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # the checkout's memra
import memra.gpu.compile as mc  # noqa: E402


def cubin(kdir: Path, kernel: str, defs: dict) -> bytes:
    orig = mc.kernel_dir
    mc.kernel_dir = lambda: kdir
    try:
        return mc.compile_cubin(kernel, "sm_90a", defs, use_cache=False)
    finally:
        mc.kernel_dir = orig


def sass(cub: bytes) -> str:
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cub)
        f.flush()
        return subprocess.run(["nvdisasm", "-c", f.name], capture_output=True, text=True, check=True).stdout


def modules(text: str, kernel: str | None) -> list[tuple[str, dict]]:
    """(kernel file, defines) per module, each once, in the order MODULES names them."""
    mods = []
    for line in text.splitlines():
        m = re.search(r"compile sm_90a (\S+\.cu) ((?:-D\S+ ?)+)", line)
        if m:
            k, toks = m.group(1), m.group(2)
        elif kernel and line.strip().startswith("-D"):
            k, toks = kernel, line
        else:
            continue
        mod = (k, dict(t[2:].split("=", 1) for t in toks.split()))
        if mod not in mods:
            mods.append(mod)
    return mods


def main() -> int:
    old, new = Path(sys.argv[1]).resolve(), Path(sys.argv[2]).resolve()
    mods = modules(Path(sys.argv[3]).read_text(), sys.argv[4] if len(sys.argv) > 4 else None)
    same = diff = 0
    for kernel, defs in mods:
        ok = sass(cubin(old, kernel, defs)) == sass(cubin(new, kernel, defs))
        same += ok
        diff += not ok
        print(("SAME " if ok else "DIFF ") + kernel + " " + " ".join(f"-D{k}={v}" for k, v in sorted(defs.items())),
              flush=True)
    print(f"{same} identical, {diff} different (of {len(mods)} modules)")
    return 1 if diff or not mods else 0


if __name__ == "__main__":
    sys.exit(main())
