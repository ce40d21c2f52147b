"""`memra warmup`: compile, ahead of the first run, the kernel modules a model needs, into the
cubin cache ($MEMRA_HOME/cubin), so the first `memra run --device gpu` does not wait for NVRTC.

NVRTC runs without a GPU, so this works on any machine for any target arch (the default is
this GPU's, else sm_90a); the cache key does not depend on the machine, so a cache made on a
CPU-only box serves a GPU machine with the same kernel sources and NVRTC version.

Which modules: `model_modules` takes them from each kernel family's `compile_variants()`
(memra.tune.kernelcheck.FAMILIES, the list `memra kernel-check --compile-only` compiles),
leaves out the canaries (MEMRA_CANARY), and, given a model, keeps the variants that fit it:
matvec modules of its weight types (MV_TYPE), attention and RoPE modules of its head size
(HEAD_DIM) and query heads per KV head (N_GQA). That list is the families' built-in
configurations at the shapes their checks use; a module the engine builds with other
defines (a tuning table's configuration, a head size no check uses) is still compiled at
its first use. When the launch plan (memra.gpu.plan) lists a model's launches with their
defines, this function takes the list from it instead, and nothing else changes.
"""

from __future__ import annotations

import importlib
import time
from typing import Callable, Iterable, Iterator

from memra.errors import MemraError

CANARY = "MEMRA_CANARY"


def _fits(defines: dict, types: set[int] | None, head_dim: int | None, n_gqa: int | None) -> bool:
    if types is not None and "MV_TYPE" in defines and int(defines["MV_TYPE"]) not in types:
        return False
    if head_dim is not None and "HEAD_DIM" in defines and int(defines["HEAD_DIM"]) != head_dim:
        return False
    if n_gqa is not None and "N_GQA" in defines and int(defines["N_GQA"]) != n_gqa:
        return False
    return True


def model_modules(g=None) -> list[tuple[str, str, dict]]:
    """(family, kernel file, -D defines) of every module to compile; all families' non-canary
    variants without a model, those that fit the model (an open GGUF) with one."""
    from memra.tune.kernelcheck import FAMILIES

    types = head_dim = n_gqa = None
    if g is not None:
        from gguf.constants import GGMLQuantizationType

        from memra.model.config import read_config

        cfg = read_config(g)
        types = {int(GGMLQuantizationType[t.type_name]) for t in g.tensors.values() if len(t.shape) == 2}
        head_dim, n_gqa = cfg.head_dim, cfg.n_head // cfg.n_head_kv
    out, seen = [], set()
    for fam, modname in FAMILIES.items():
        for kernel_file, defines in importlib.import_module(modname).compile_variants():
            if CANARY in defines or not _fits(defines, types, head_dim, n_gqa):
                continue
            key = (kernel_file, tuple(sorted((k, str(v)) for k, v in defines.items())))
            if key not in seen:
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
