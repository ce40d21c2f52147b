"""NVRTC: kernels/*.cu straight to CUBIN, with an on-disk cache.

The cache key is a hash of the kernel source, every header it includes (followed
recursively through `#include "..."`), the full NVRTC option list (defines included), the
target arch and the NVRTC version, so any change to what the compiler sees recompiles.
Entries are written to a temporary file and `os.replace`d into place: concurrent
processes never read a half-written cubin. NVRTC runs without a GPU, so every kernel can be
compiled on a CPU-only machine (CI does that through `memra kernel-check --compile-only`).
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import threading
import time
from functools import lru_cache
from pathlib import Path
from typing import Mapping

from memra.atomic import write_atomic
from memra.errors import CompileError, MemraError
from memra.paths import cubin_dir, kernel_dir

log = logging.getLogger("memra.compile")

# The archs memra builds for: Hopper (H100/H200), Blackwell consumer (RTX 50), Ada.
ARCHS = ("sm_90a", "sm_120a", "sm_89")

_INCLUDE_RE = re.compile(r'^\s*#\s*include\s*"([^"]+)"', re.MULTILINE)


@lru_cache(maxsize=1)
def nvrtc_version() -> tuple[int, int]:
    from cuda.bindings import nvrtc

    err, major, minor = nvrtc.nvrtcVersion()
    _check(err, "nvrtcVersion")
    return int(major), int(minor)


def _check(err, what: str) -> None:
    from cuda.bindings import nvrtc

    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        raise MemraError(f"{what} failed: {err!r}")


def _sources(kernel_file: str, root: Path | None = None) -> list[tuple[str, bytes]]:
    """The .cu file and every header it includes (transitively), as (name, bytes), in a
    stable order. Only quoted includes that resolve inside root (kernel_dir()) are followed."""
    root = root or kernel_dir()
    seen: dict[str, bytes] = {}
    todo = [kernel_file]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        path = root / name
        if not path.is_file():
            if name == kernel_file:
                raise MemraError(f"kernel source {name!r} not found in {root}")
            raise CompileError(kernel_file, [], f"included header {name!r} not found in {root}")
        data = path.read_bytes()
        seen[name] = data
        for inc in _INCLUDE_RE.findall(data.decode("utf-8", "replace")):
            todo.append(inc)
    return sorted(seen.items())


def source_names(kernel_file: str) -> list[str]:
    """The kernel file and every header it includes (transitively): the files its module is built
    from (and its cache key hashes)."""
    return [name for name, _ in _sources(kernel_file)]


# NVRTC options a kernel file needs beyond options_for's (part of its cubin's cache key through the options)
FILE_OPTIONS = {
    # generic lambdas inside the kernel body: NVRTC 12 takes them for host functions without it (13 does not)
    "gemm_f16_wg.cu": ("-default-device",),
}


def _file_extra(kernel_file: str, extra: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(extra) + FILE_OPTIONS.get(kernel_file, ())


def options_for(arch: str, defines: Mapping[str, object] | None = None,
                extra: tuple[str, ...] = (), root: Path | None = None) -> list[str]:
    """The full NVRTC option list. No --use_fast_math: kernels must match their CPU
    references exactly where the family's tolerance says so. -lineinfo costs nothing at
    run time and makes compute-sanitizer and ncu reports readable."""
    if not re.fullmatch(r"sm_\d+[a-z]?", arch):
        raise MemraError(f"bad GPU arch {arch!r} (expected e.g. sm_90a)")
    opts = [f"--gpu-architecture={arch}", "-std=c++17", "-lineinfo",
            f"-I{root or kernel_dir()}"]
    for k, v in sorted((defines or {}).items()):
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", k):
            raise MemraError(f"bad define name {k!r}")
        opts.append(f"-D{k}" if v is None or v is True else f"-D{k}={v}")
    opts.extend(extra)
    return opts


def cache_key(kernel_file: str, arch: str, options: list[str]) -> str:
    h = hashlib.sha256()
    h.update(repr(nvrtc_version()).encode())
    h.update(arch.encode())
    # the -I path differs between machines but not what it points at: hash contents instead
    for o in options:
        if not o.startswith("-I"):
            h.update(b"\0opt\0" + o.encode())
    for name, data in _sources(kernel_file):
        h.update(b"\0src\0" + name.encode() + b"\0" + hashlib.sha256(data).digest())
    return h.hexdigest()[:32]


def source_hash(kernel_file: str, root: Path | None = None) -> str:
    """Hash of a kernel file and its headers alone (for tuning receipts and tables); root: another
    kernels folder than kernel_dir() (an older tree's: memra.tune.carry)."""
    h = hashlib.sha256()
    for name, data in _sources(kernel_file, root):
        h.update(name.encode() + b"\0" + hashlib.sha256(data).digest())
    return h.hexdigest()[:16]


def cubin_path(kernel_file: str, arch: str, defines: Mapping[str, object] | None = None,
               extra: tuple[str, ...] = ()) -> Path:
    """Where the cubin cache keeps (or will keep) this module."""
    options = options_for(arch, defines, _file_extra(kernel_file, extra))
    return cubin_dir() / f"{Path(kernel_file).stem}-{arch}-{cache_key(kernel_file, arch, options)}.cubin"


def compile_cubin(kernel_file: str, arch: str, defines: Mapping[str, object] | None = None,
                  extra: tuple[str, ...] = (), use_cache: bool = True, root: Path | None = None) -> bytes:
    """Compile kernels/<kernel_file> for `arch` with `defines`; returns the CUBIN bytes. root: another
    kernels folder than kernel_dir() (an older tree's: memra.tune.carry), never cached.

    Raises CompileError (carrying the NVRTC log) when NVRTC rejects the source."""
    if root is not None:
        return _nvrtc(kernel_file, options_for(arch, defines, _file_extra(kernel_file, extra), root), root)[0]
    path = cubin_path(kernel_file, arch, defines, extra)
    options = options_for(arch, defines, _file_extra(kernel_file, extra))
    if use_cache and path.is_file():
        log.debug("cubin cache hit: %s %s %s", kernel_file, arch, path.name)
        return path.read_bytes()
    t0 = time.perf_counter()
    cubin, nv_log = _nvrtc(kernel_file, options)
    log.debug("compiled %s for %s in %.0f ms (%s)%s", kernel_file, arch,
              1e3 * (time.perf_counter() - t0), " ".join(o for o in options if o.startswith("-D")),
              ("\n" + nv_log) if nv_log.strip() else "")
    if use_cache:
        write_atomic(path, cubin)
    return cubin


def _nvrtc(kernel_file: str, options: list[str], root: Path | None = None) -> tuple[bytes, str]:
    from cuda.bindings import nvrtc

    src = ((root or kernel_dir()) / kernel_file).read_bytes()
    err, prog = nvrtc.nvrtcCreateProgram(src, kernel_file.encode(), 0, [], [])
    _check(err, "nvrtcCreateProgram")
    try:
        (err,) = nvrtc.nvrtcCompileProgram(prog, len(options), [o.encode() for o in options])
        _, size = nvrtc.nvrtcGetProgramLogSize(prog)
        # NVRTC writes into these buffers: they must be fresh mutable memory. `b" " * 1` is
        # CPython's shared one-byte b" " object, and writing the log's NUL into it turned
        # every later " ".encode() in the process into b"\x00".
        buf = bytearray(size)
        nvrtc.nvrtcGetProgramLog(prog, buf)
        text = bytes(buf).rstrip(b"\0 ").decode("utf-8", "replace")
        if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            raise CompileError(kernel_file, options, text or repr(err))
        e2, size = nvrtc.nvrtcGetCUBINSize(prog)
        _check(e2, "nvrtcGetCUBINSize")
        cubin = bytearray(size)
        (e3,) = nvrtc.nvrtcGetCUBIN(prog, cubin)
        _check(e3, "nvrtcGetCUBIN")
        return bytes(cubin), text
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


def _compile_job(job):
    kernel_file, arch, defines = job
    t0 = time.perf_counter()
    try:
        compile_cubin(kernel_file, arch, defines)
        return None, time.perf_counter() - t0
    except CompileError as e:
        return e.log, time.perf_counter() - t0


def compile_many(jobs: list[tuple[str, str, dict]], workers: int | None = None):
    """Compile (kernel_file, arch, defines) jobs in parallel processes (into the cache).
    Yields (job, nvrtc_log_or_None, seconds) in the jobs' order."""
    workers = workers or os.cpu_count() or 1
    if workers <= 1 or len(jobs) <= 1:
        for j in jobs:
            yield (j, *_compile_job(j))
        return
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    # spawn, not fork: the parent may hold a CUDA context, which a forked child must not inherit
    from concurrent.futures.process import BrokenProcessPool

    ctx = multiprocessing.get_context("spawn")
    try:
        with ProcessPoolExecutor(max_workers=min(workers, len(jobs)), mp_context=ctx) as ex:
            results = list(ex.map(_compile_job, jobs))
    except BrokenProcessPool:  # e.g. a __main__ that spawned workers cannot re-import
        log.warning("parallel compile unavailable here; compiling %d kernels one by one", len(jobs))
        results = [_compile_job(j) for j in jobs]
    for j, r in zip(jobs, results):
        yield (j, *r)


class AheadOfUse:
    """Kernel modules compiled into the cubin cache by parallel processes (compile_many) on a background thread while
    the caller goes on — a runner uploads its weights meanwhile, then joins, so its first steps load every module from
    the cache instead of compiling them one at a time. A module not compiled yet when it is loaded (or whose compile
    failed here) is compiled where it is loaded, as without this: NVRTC gives the same CUBIN either way.
    modules: a callable giving (kernel file, defines) pairs, called on the thread."""

    def __init__(self, modules, arch: str, workers: int | None = None):
        self.compiled, self.cached, self.failed, self.seconds = 0, 0, [], 0.0
        self._thread = threading.Thread(target=self._run, args=(modules, arch, workers), name="memra-compile-ahead",
                                        daemon=True)
        self._thread.start()

    def _run(self, modules, arch: str, workers: int | None) -> None:
        t0 = time.perf_counter()
        try:
            jobs = [(f, arch, dict(d)) for f, d in modules()]
            todo = [j for j in jobs if not cubin_path(*j).is_file()]
            self.cached = len(jobs) - len(todo)
            for job, nv_log, _ in compile_many(todo, workers):
                if nv_log is None:
                    self.compiled += 1
                else:
                    self.failed.append(job)
        except Exception as e:  # noqa: BLE001 - the modules still compile where they are loaded
            log.warning("compiling kernel modules ahead failed (%s: %s); each compiles where it is first loaded",
                        type(e).__name__, e)
        self.seconds = time.perf_counter() - t0

    def join(self) -> "AheadOfUse":
        self._thread.join()
        if self.failed:
            log.warning("%d kernel modules did not compile ahead (%s); their loads will raise NVRTC's log",
                        len(self.failed), ", ".join(f"{f} {d}" for f, _, d in self.failed[:3]))
        log.info("kernel modules ahead of use: %d compiled, %d cached in %.1f s", self.compiled, self.cached,
                 self.seconds)
        return self
