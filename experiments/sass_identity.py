#!/usr/bin/env python3
"""sass_identity: modules of one kernel file compiled from two kernel trees must compile to the same
code (sm_90a) — how a variant behind a default-off define shows it leaves the default modules untouched.

    python3 experiments/sass_identity.py OLD_KERNELS_DIR NEW_KERNELS_DIR MODULES [KERNEL]
MODULES: a `python3 -m memra kernel-check --compile-only --arch sm_90a [--only F]` log (its
'compile sm_90a <file>.cu -D...' lines name the modules and their file), or one module a line as
'-DK=V -DK=V ...' with KERNEL (e.g. mvt.cu). Each module is compiled from each tree by
memra.gpu.compile.compile_cubin(root=) — memra's own NVRTC options — and the CUBINs' code sections
compared byte for byte (memra.tune.carry.code_sections: what `memra tune carry` compares for the
receipts' modules; the .text bytes include the scheduling bits nvdisasm's text leaves out).
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # the checkout's memra
from memra.gpu.compile import compile_cubin  # noqa: E402
from memra.tune.carry import code_sections  # noqa: E402


def code(kdir: Path, kernel: str, defs: dict) -> dict[str, bytes]:
    return code_sections(compile_cubin(kernel, "sm_90a", defs, root=kdir))


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
        ok = code(old, kernel, defs) == code(new, kernel, defs)
        same += ok
        diff += not ok
        print(("SAME " if ok else "DIFF ") + kernel + " " + " ".join(f"-D{k}={v}" for k, v in sorted(defs.items())),
              flush=True)
    print(f"{same} identical, {diff} different (of {len(mods)} modules)")
    return 1 if diff or not mods else 0


if __name__ == "__main__":
    sys.exit(main())
