"""The GPU half of `memra tune`: `measure(job)` for memra.tune.campaign.run_campaign.

Each kernel family's module memra/gpu/ops/<src stem>.py exposes one hook,

    tune_case(g, kernel, variant, config, shape, rng, rotate_bytes) -> case

building the job's inputs on the device: fresh random inputs, in `case.sets` copies whose
footprint together exceeds `rotate_bytes` (twice the L2, so timed launches stream from
HBM as in a real decode step, not from a warm cache). The case offers:

    case.bytes      bytes one launch reads and writes (for GB/s)
    case.sets       number of input copies
    case.check()    -> (ok, max_err, detail): one launch on poisoned outputs, compared with
                    the family's numpy reference at its tolerance
    case.launch(i)  enqueue one launch on copy i (capturable in a CUDA graph)

and optionally `tune_modules(kernel, variant, config, shape) -> [(kernel file, defines)]`,
the modules a job loads, so `precompile` can build a whole campaign's in parallel first.

A configuration is timed only after its check passed. Timing captures `LAUNCHES` launches
(cycling through the copies) in one CUDA graph and times whole replays with CUDA events, so
the per-launch time includes the graph-node cost the engine pays, not the ~7 µs of a Python
launch; median, p20 and p80 are over the replays. The launches are plain (each waits for the
previous one to finish) unless `pdl`: then every launch of the case is a programmatic dependent
launch, as the engine's are (memra.gpu.runner: MEMRA_PDL), so what a kernel does before its
MEMRA_PDL_WAIT overlaps the previous copy's run as it overlaps the previous op's in a decode
step. The two timings are different measurements: their receipts say which (`timing`), and
freeze never compares one with the other.
"""

from __future__ import annotations

import importlib
import math
from pathlib import Path
from typing import Callable, Iterable

import numpy as np

from memra.errors import MemraError

LAUNCHES = 20  # launches per captured graph (at least `case.sets`)


def family_module(src: str):
    """memra.gpu.ops.<stem> of a job's kernel file; of several joined by "+" (a family with a kernel
    file per implementation, e.g. gemm_f16.cu+gemm_f16_wg.cu), the first's."""
    return importlib.import_module(f"memra.gpu.ops.{_stem(src)}")


def _stem(src: str) -> str:
    return Path(src.split("+")[0]).stem


def is_builtin(row) -> bool:
    """Whether a receipt row's configuration is its launcher's built-in default, as the
    family module's is_builtin(kernel, variant, config, shape) hook says (False for a family
    without one; a dispatch entry's: memra.tune.dispatch): freeze's test for --min-gain."""
    from memra.tune import dispatch

    if row["kernel"] in dispatch.KERNELS:
        return dispatch.is_builtin(row["kernel"], row["variant"], dict(row["config"]),
                                   {**dict(row["shape"]), "batch": int(row["batch"])})
    try:
        hook = getattr(family_module(row["src"]), "is_builtin", None)
    except ModuleNotFoundError:
        return False
    return bool(hook and hook(row["kernel"], row["variant"], dict(row["config"]),
                              {**dict(row["shape"]), "batch": int(row["batch"])}))


def reached(row) -> bool:
    """freeze's keep test: False for a dispatch receipt at a row count the engine never launches
    for its shape (memra.tune.dispatch.reached), True for every other receipt."""
    from memra.tune import dispatch

    if row["kernel"] not in dispatch.KERNELS:
        return True
    ops = row.get("ops")
    ops = [ops] if isinstance(ops, str) else list(ops if ops is not None else ())
    return not ops or dispatch.reached(ops, int(row["batch"]))


def check_variants(jobs: Iterable) -> None:
    """Refuse a job whose kernel or variant its family does not measure (the family module's
    TUNE_VARIANTS: {kernel: variants}), naming the ones it does: a typo in a campaign would
    otherwise list (--dry-run) or record failed receipts only. Families without the table,
    and sources with no family module (require_hooks' refusal), are left alone."""
    seen = set()
    for j in jobs:
        if (j.src, j.kernel, j.variant) in seen:
            continue
        seen.add((j.src, j.kernel, j.variant))
        try:
            known = getattr(family_module(j.src), "TUNE_VARIANTS", None)
        except ModuleNotFoundError:
            continue
        if known is None:
            continue
        if j.kernel not in known:
            raise MemraError(f"campaign {j.campaign}: {j.src} measures no kernel {j.kernel!r} "
                             f"(its kernels: {', '.join(known)})")
        if j.variant not in known[j.kernel]:
            raise MemraError(f"campaign {j.campaign}: kernel {j.kernel} has no variant {j.variant!r} "
                             f"(its variants: {', '.join(known[j.kernel])})")


def require_hooks(jobs: Iterable) -> None:
    """Refuse a campaign up front when a family cannot be measured (rather than recording
    every job of it as failed)."""
    missing = set()
    for src in sorted({j.src for j in jobs}):
        try:
            mod = family_module(src)
        except ModuleNotFoundError:
            missing.add(f"{src} (no module memra.gpu.ops.{_stem(src)})")
            continue
        if not callable(getattr(mod, "tune_case", None)):
            missing.add(f"{src} (memra.gpu.ops.{_stem(src)} has no tune_case)")
    if missing:
        raise MemraError("these kernel families cannot be tuned yet: " + "; ".join(sorted(missing)))


def precompile(jobs: Iterable, arch: str, workers: int | None = None) -> tuple[int, int]:
    """Compile every module the jobs will load into the cubin cache, in parallel processes,
    before anything is timed. Families with a `tune_modules(kernel, variant, config, shape)
    -> [(kernel file, defines)]` hook take part; the others compile as their jobs run. A
    module that fails to compile is left to its job, which records the error. Returns
    (modules, failed)."""
    from memra.gpu.compile import compile_many

    todo: dict[tuple, tuple[str, dict]] = {}
    for j in jobs:
        hook = getattr(family_module(j.src), "tune_modules", None)
        if hook is None:
            continue
        try:
            mods = hook(j.kernel, j.variant, dict(j.config), dict(j.shape))
        except MemraError:
            continue  # refused by the family: its job records why
        for f, d in mods:
            todo.setdefault((f, tuple(sorted((k, str(v)) for k, v in d.items()))), (f, d))
    work = [(f, arch, d) for f, d in todo.values()]
    failed = sum(1 for _, err, _ in compile_many(work, workers) if err)
    return len(work), failed


def device_context(g) -> dict:
    """The device facts every receipt carries."""
    from memra.gpu.compile import nvrtc_version
    from memra.tune.receipts import git_sha

    info = g.info
    return {"device": info.name, "cc": tuple(info.cc), "sms": int(info.sm_count),
            "nvrtc": "%d.%d" % nvrtc_version(), "peak_gbps": g.copy_bandwidth() / 1e9,
            "git_sha": git_sha()}


class PdlLaunches:
    """`g` with every kernel launch a programmatic dependent launch (gpu_measure's `pdl`)."""

    def __init__(self, g):
        self._g = g

    def launch(self, kernel, grid, block, args, shmem: int = 0, pdl: bool = False) -> None:
        self._g.launch(kernel, grid, block, args, shmem, True)

    def __getattr__(self, name):
        return getattr(self._g, name)


def gpu_measure(g, *, reps: int = 100, seed: int | None = None, pdl: bool = False) -> Callable:
    """measure(job) on GPU `g` (memra.gpu.cuda.gpu()); `job.reps` overrides `reps`; `pdl`: every
    launch of a case with PDL (the module doc)."""
    rng = np.random.default_rng(seed)
    rotate = 2 * int(g.info.l2_bytes)
    gc = PdlLaunches(g) if pdl else g

    def measure(job) -> dict:
        case = family_module(job.src).tune_case(gc, job.kernel, job.variant, dict(job.config),
                                                dict(job.shape), rng, rotate)
        ok, max_err, detail = case.check()
        max_err = None if max_err is None or not math.isfinite(max_err) else float(max_err)
        if not ok:
            return {"ok": False, "max_err": max_err, "error": detail or "check failed"}
        n = max(LAUNCHES, case.sets)
        n -= n % case.sets  # every copy equally often
        with g.capture() as graph:
            for i in range(n):
                case.launch(i % case.sets)
        try:
            graph.upload()
            ms = np.asarray(g.time_ms(graph.launch, reps=job.reps or reps, warmup=5), dtype=float)
        finally:
            graph.close()
        us = ms * 1e3 / n
        p20, med, p80 = np.percentile(us, [20, 50, 80])
        return {"ok": True, "max_err": max_err, "median_us": float(med), "p20_us": float(p20),
                "p80_us": float(p80), "reps": int(len(us)), "bytes": int(case.bytes)}

    return measure
