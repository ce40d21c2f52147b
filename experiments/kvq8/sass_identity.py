"""SASS identity of the f16 attention / rope / attn_fa modules before and after the q8_0 KV patch.

    PYTHONPATH=. python3 experiments/kvq8/sass_identity.py /work/main/kernels kernels [--arch sm_90a] [--launch-set]

Compiles every f16 compile variant of memra.gpu.ops.attention / rope / attn_fa (the kernel-check
set, the canaries included; the q8_0 variants the patch adds are skipped) from both kernel
directories with the same defines (memra.gpu.compile.compile_cubin, use_cache=False, kernel_dir
monkeypatched), disassembles each with nvdisasm (no line info) and compares the text."""

from __future__ import annotations

import argparse
import pathlib
import subprocess
import sys
import tempfile

import memra.gpu.compile as C
from memra.gpu.ops import attention, attn_fa, rope


def sass(kdir: pathlib.Path, file: str, defines: dict, arch: str) -> str:
    C.kernel_dir = lambda: kdir
    cub = C.compile_cubin(file, arch, defines, use_cache=False)
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cub)
        f.flush()
        return subprocess.run(["nvdisasm", "-c", f.name], check=True, capture_output=True, text=True).stdout


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("before")
    ap.add_argument("after")
    ap.add_argument("--arch", default="sm_90a")
    ap.add_argument("--launch-set", action="store_true",
                    help="also every f16 rope / attention / attn_fa module of the kernel-check launch set "
                         "(the models' and the H200 table's configurations)")
    a = ap.parse_args()
    variants = [v for m in (attention, rope, attn_fa) for v in m.compile_variants()]
    if a.launch_set:
        import memra.tune.launches as LS
        from memra.tune.tables import read_table, tables_dir

        specs, _ = LS.model_specs()
        cases = LS.launch_set(specs, [read_table(tables_dir() / "nvidia-h200.json")])
        variants += [v for v in LS.launch_modules(cases) if v[0] in ("rope.cu", "attention.cu", "attn_fa.cu")]
    seen, uniq = set(), []
    for f, d in variants:
        k = (f, tuple(sorted(d.items())))
        if k not in seen and not any(x in d for x in ("KV_K_Q8", "KV_V_Q8")):
            seen.add(k)
            uniq.append((f, d))
    variants = uniq
    bad = 0
    for file, d in variants:
        x, y = (sass(pathlib.Path(p).resolve(), file, d, a.arch) for p in (a.before, a.after))
        same = x == y
        bad += not same
        print(f"{'identical' if same else 'DIFFERENT'}  {file} {d}  ({x.count(chr(10))} lines)", flush=True)
    print(f"{len(variants) - bad}/{len(variants)} f16 modules byte-identical SASS")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
