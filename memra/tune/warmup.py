"""`memra warmup`: compile, ahead of the first run, the kernel modules a model needs, into the
cubin cache ($MEMRA_HOME/cubin), so the first `memra run --device gpu` does not wait for NVRTC.

NVRTC runs without a GPU, so this works on any machine for any target arch (the default is
this GPU's, else sm_90a); the cache key does not depend on the machine, so a cache made on a
CPU-only box serves a GPU machine with the same kernel sources and NVRTC version.

Which modules: given a model, `model_modules` takes them from its launch plan
(memra.tune.launches.launch_set over the model's ModelSpec, with the built-in configurations
and every device table in tune/defaults and $MEMRA_HOME/tables): every module its decode
steps, prefill chunks and heads can load, on every path the runner takes. Without a model,
each kernel family's `compile_variants()` (the list `memra kernel-check --compile-only`
compiles), canaries left out.
"""

from __future__ import annotations

import importlib
from typing import Callable, Iterable, Iterator

from memra.errors import MemraError

CANARY = "MEMRA_CANARY"


def model_modules(g=None) -> list[tuple[str, str, dict]]:
    """(family, kernel file, -D defines) of every module to compile: the model's launch set
    (an open GGUF), else every family's non-canary variants."""
    if g is not None:
        from memra.gpu.plan import ModelSpec
        from memra.tune.launches import launch_set
        from memra.tune.tables import list_tables

        cases = launch_set([ModelSpec.from_gguf(g)], tables=list_tables(), other_entries=False)
        out, seen = [], set()
        for c in cases.values():
            key = (c["file"], tuple(sorted((k, str(v)) for k, v in c["defines"].items())))
            if key not in seen and CANARY not in c["defines"]:
                seen.add(key)
                out.append((c["family"], c["file"], dict(c["defines"])))
        return out
    from memra.tune.kernelcheck import FAMILIES

    out, seen = [], set()
    for fam, modname in FAMILIES.items():
        for kernel_file, defines in importlib.import_module(modname).compile_variants():
            key = (kernel_file, tuple(sorted((k, str(v)) for k, v in defines.items())))
            if CANARY not in defines and key not in seen:
                seen.add(key)
                out.append((fam, kernel_file, dict(defines)))
    return out


def warmup(modules: Iterable[tuple[str, str, dict]], archs: Iterable[str], workers: int | None = None,
           progress: Callable[[int, int], None] = lambda done, total: None) -> Iterator[dict]:
    """Compile each module for each arch into the cubin cache, in parallel processes; yields
    one dict per module and arch as it is ready: family, file, arch, defines, cached (it was
    there already), seconds, error (the NVRTC log, or None). progress(done, total) follows."""
    import multiprocessing
    import os
    from concurrent.futures import ProcessPoolExecutor, as_completed

    from memra.gpu.compile import _compile_job, cubin_path

    jobs = [(fam, (kernel_file, arch, defines)) for fam, kernel_file, defines in modules for arch in archs]
    if not jobs:
        raise MemraError("no kernel modules to compile")
    done, total = 0, len(jobs)
    todo = []
    for fam, job in jobs:
        if cubin_path(*job).is_file():
            done += 1
            yield {"family": fam, "file": job[0], "arch": job[1], "defines": job[2], "cached": True,
                   "seconds": 0.0, "error": None}
        else:
            todo.append((fam, job))
    progress(done, total)
    if not todo:
        return
    workers = max(1, min(workers or os.cpu_count() or 1, len(todo)))
    # spawn, not fork: the parent may hold a CUDA context, which a child must not inherit
    with ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn")) as ex:
        futures = {ex.submit(_compile_job, job): (fam, job) for fam, job in todo}
        for f in as_completed(futures):
            fam, job = futures[f]
            log, secs = f.result()
            done += 1
            progress(done, total)
            yield {"family": fam, "file": job[0], "arch": job[1], "defines": job[2], "cached": False,
                   "seconds": round(secs, 3), "error": log}
