#!/usr/bin/env python3
"""sass_identity: mvt.cu modules of two kernel trees must disassemble identically (nvdisasm, sm_90a).

    python3 experiments/mvt/v7/sass_identity.py OLD_KERNELS_DIR NEW_KERNELS_DIR DEFSETS_FILE
DEFSETS_FILE: one module a line as '-DK=V -DK=V ...' (e.g. grepped from a
`memra kernel-check --compile-only --arch sm_90a --only mvt` log). Compiles both through NVRTC
(the options experiments/mvt/sass_count.py uses), compares `nvdisasm -c` of the whole cubin.
"""
from __future__ import annotations

import io
import subprocess
import sys
import tempfile
from pathlib import Path


def cubin(kdir: Path, defs: dict) -> bytes:
    from cuda.core import Program, ProgramOptions
    opts = ProgramOptions(name="mvt.cu", arch="sm_90a", std="c++17", lineinfo=True, include_path=[str(kdir)],
                          define_macro=[(k, str(v)) for k, v in sorted(defs.items())])
    return bytes(Program((kdir / "mvt.cu").read_text(), "c++", opts).compile("cubin", logs=io.StringIO()).code)


def sass(cub: bytes) -> str:
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cub)
        f.flush()
        return subprocess.run(["nvdisasm", "-c", f.name], capture_output=True, text=True, check=True).stdout


def main() -> int:
    old, new, lst = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
    same = diff = 0
    for line in lst.read_text().splitlines():
        if not line.strip():
            continue
        defs = dict(tok[2:].split("=", 1) for tok in line.split())
        a, b = sass(cubin(old, defs)), sass(cubin(new, defs))
        ok = a == b
        same += ok
        diff += not ok
        print(f"{'same' if ok else 'DIFF'}  {line}  ({a.count(chr(10))} lines)", flush=True)
    print(f"{same} identical, {diff} different")
    return 1 if diff else 0


if __name__ == "__main__":
    sys.exit(main())
