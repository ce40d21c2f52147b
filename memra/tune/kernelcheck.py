"""`memra kernel-check`: every kernel and variant against its CPU reference.

Each kernel family lives in one module under memra/gpu/ops/ and offers three functions:

    compile_variants() -> list[tuple[str, dict]]
        every (kernel file, -D defines) the family builds, its canaries included;
    checks(g: memra.gpu.cuda.Gpu, rng: np.random.Generator) -> Iterator[Outcome]
        runs each kernel/variant on fresh random inputs (never zeros) with its outputs
        poisoned before the launch, and compares with the numpy reference (use
        memra.gpu.compare.compare);
    canaries(g, rng) -> Iterator[Outcome]
        deliberately wrong variants (compiled with -DMEMRA_CANARY=...): each must FAIL its
        comparison, or the check itself is too weak and kernel-check goes red.

FAMILIES below is the whole list (a literal dict, no registration machinery): add a line
when a family module appears. A family whose module is missing is reported as a failure.
"""

from __future__ import annotations

import importlib
from typing import Iterator, Sequence

import numpy as np

FAMILIES: dict[str, str] = {
    "matvec": "memra.gpu.ops.matvec",
    "embed": "memra.gpu.ops.embed",
    "norm": "memra.gpu.ops.norm",
    "rope": "memra.gpu.ops.rope",
    "attention": "memra.gpu.ops.attention",
    "act": "memra.gpu.ops.act",
    "sample": "memra.gpu.ops.sample",
    "gemm": "memra.gpu.ops.gemm",
}


def _family_modules(only: str | None):
    names = list(FAMILIES) if only is None else [f.strip() for f in only.split(",")]
    for fam in names:
        if fam not in FAMILIES:
            raise KeyError(f"unknown kernel family {fam!r} (known: {', '.join(FAMILIES)})")
        yield fam, FAMILIES[fam]


def run_kernel_check(only: str | None = None, compile_only: bool = False,
                     seed: int | None = None, archs: Sequence[str] | None = None) -> Iterator[str]:
    """Yield one line per check; the last line is 'ALL GREEN ...' or 'FAILED ...'.

    compile_only: compile every variant of every family for each arch in `archs` (default
    memra.gpu.compile.ARCHS) with NVRTC (no GPU needed)."""
    from memra.gpu.compile import ARCHS, compile_many

    failures = 0
    passed = 0
    caught = 0
    try:
        fams = list(_family_modules(only))
    except KeyError as e:
        yield f"FAILED: {e.args[0]}"
        return
    if not compile_only:
        from memra.gpu.cuda import gpu, has_gpu

        if not has_gpu():
            yield "FAILED: no CUDA GPU here (use --compile-only to just compile the kernels)"
            return
        g = gpu()
        yield f"device: {g.info.name} ({g.info.arch}, {g.info.sm_count} SMs)"
    # fresh inputs each run unless a seed is asked for (to reproduce a failure)
    seed = int(np.random.SeedSequence().entropy % (1 << 31)) if seed is None else seed
    yield f"seed: {seed}"
    rng = np.random.default_rng(seed)
    for fam, modname in fams:
        try:
            mod = importlib.import_module(modname)
        except Exception as e:  # a family that cannot even be imported is a failure
            failures += 1
            yield f"FAIL  {fam}: cannot import {modname}: {e}"
            continue
        if compile_only:
            jobs = [(f, arch, d) for f, d in mod.compile_variants() for arch in (archs or ARCHS)]
            for (kernel_file, arch, defines), log, secs in compile_many(jobs):
                dtext = " ".join(f"-D{k}={v}" for k, v in sorted(defines.items()))
                if log is None:
                    passed += 1
                    yield f"PASS  {fam} compile {arch} {kernel_file} {dtext} ({secs:.1f} s)"
                else:
                    failures += 1
                    yield f"FAIL  {fam} compile {arch} {kernel_file} {dtext}\n{log}"
            continue
        try:
            for o in mod.checks(g, rng):
                if o.ok:
                    passed += 1
                else:
                    failures += 1
                yield f"{'PASS' if o.ok else 'FAIL'}  {fam} {o.name}: {o.detail}"
            for o in mod.canaries(g, rng):
                if o.ok:
                    failures += 1
                    yield f"FAIL  {fam} canary {o.name} was NOT caught: {o.detail}"
                else:
                    caught += 1
                    yield f"PASS  {fam} canary {o.name} caught: {o.detail}"
        except Exception as e:
            failures += 1
            yield f"FAIL  {fam}: {type(e).__name__}: {e}"
    if compile_only:  # canaries run on a GPU: a compile-only run has none to catch
        yield (f"FAILED: {failures} failed, {passed} compiled" if failures else
               f"ALL GREEN ({passed} compiled; checks and canaries need a GPU)")
    elif failures:
        yield f"FAILED: {failures} failed, {passed} passed, {caught} canaries caught"
    else:
        yield f"ALL GREEN ({passed} checks passed, {caught} canaries caught)"


def all_green(lines: list[str]) -> bool:
    """True when a finished run_kernel_check() ended green (for the CLI's exit code)."""
    return bool(lines) and lines[-1].startswith("ALL GREEN")
