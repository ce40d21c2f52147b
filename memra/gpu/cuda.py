"""The GPU runtime: device facts, one stream, buffers, modules, launches, graphs, timing.

The only module that imports cuda.core / cuda.bindings. `cuda.core` does programs,
launches, streams, events and graphs; `cuda.bindings.driver` fills the gaps (memcpy from
numpy, memset, function attributes). Importing this module never touches the driver:
`has_gpu()` answers False cleanly on a machine without one.

Usage:
    g = memra.gpu.cuda.gpu()                      # device 0, its context and stream
    mod = g.module("matvec.cu", {"ROWS": 4})  # NVRTC -> cubin (cached) -> loaded module
    k = mod.kernel("matvec_q4_0")
    x = g.to_device(np.random.rand(4096).astype(np.float32))
    y = g.empty((1024,), np.float32); y.poison()
    g.launch(k, grid=256, block=128, args=(w, x, y, np.int32(4096)))
    with g.capture() as graph:                # launches inside are recorded, not run
        g.launch(k, 256, 128, (w, x, y, np.int32(4096)))
    graph.launch(); g.sync(); y.numpy()
"""

from __future__ import annotations

import json
import logging
import os
import threading
from contextlib import contextmanager
from dataclasses import dataclass, asdict
from functools import lru_cache
from typing import Callable, Iterable, Mapping, Sequence

import numpy as np

from memra.errors import CudaError

log = logging.getLogger("memra.cuda")

_SMEM_DEFAULT_LIMIT = 48 * 1024


def poison_byte(dtype) -> int:
    """The byte a check fills an output with before a launch, one no kernel writes there:
    0xFF for floats (NaN; f16 bits in uint16 too) and for int32 (-1: token ids and indices
    are never negative); 0x80 for int8 (-128, outside the q8 rule's [-127, 127]) and for the
    Q8Scale records (d < 0 and |s| > 32 * 127). An element left unwritten then fails its
    comparison instead of passing as a plausible value."""
    dt = np.dtype(dtype)
    return 0x80 if dt.fields is not None or dt == np.int8 else 0xFF


def _drv(result, what: str):
    """Check a cuda.bindings.driver call's (err, *values) tuple; return the values."""
    from cuda.bindings import driver

    err = result[0]
    if err != driver.CUresult.CUDA_SUCCESS:
        _, name = driver.cuGetErrorName(err)
        raise CudaError(f"{what} failed: {name.decode() if isinstance(name, bytes) else err!r}")
    rest = result[1:]
    return rest[0] if len(rest) == 1 else rest


@lru_cache(maxsize=1)
def _free_host(ptr: int) -> None:
    try:
        from cuda.bindings import driver

        driver.cuMemFreeHost(ptr)
    except Exception:  # pragma: no cover - interpreter shutdown
        pass


def has_gpu() -> bool:
    """True when a CUDA driver and at least one device are present. Never raises."""
    try:
        from cuda.bindings import driver

        (err,) = driver.cuInit(0)
        if err != driver.CUresult.CUDA_SUCCESS:
            return False
        err, n = driver.cuDeviceGetCount()
        return err == driver.CUresult.CUDA_SUCCESS and n > 0
    except Exception:  # no libcuda.so, broken install, ...: all mean "no GPU here"
        return False


def arch_for(cc: tuple[int, int]) -> str:
    """NVRTC target for a compute capability: the arch-specific ('a') variants where memra
    uses their instructions (wgmma/setmaxnreg on sm_90a, sm_100a/sm_120a features)."""
    major, minor = cc
    if (major, minor) in ((9, 0), (10, 0), (10, 1), (12, 0), (12, 1)):
        return f"sm_{major}{minor}a"
    return f"sm_{major}{minor}"


@dataclass(frozen=True)
class DeviceInfo:
    index: int
    name: str
    cc: tuple[int, int]
    arch: str
    sm_count: int
    l2_bytes: int
    total_mem: int
    smem_per_block_optin: int
    driver_version: int


class DeviceArray:
    """A typed view of device memory. `ptr` is the raw address; several arrays may view one
    allocation (`view`), the owner keeps it alive. Passed to launches as a 64-bit pointer."""

    __slots__ = ("gpu", "shape", "dtype", "ptr", "nbytes", "_owner")

    def __init__(self, gpu: "Gpu", ptr: int, shape: tuple[int, ...], dtype, owner):
        self.gpu = gpu
        self.ptr = int(ptr)
        self.shape = tuple(int(s) for s in shape)
        self.dtype = np.dtype(dtype)
        self.nbytes = int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize
        self._owner = owner

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    def __repr__(self) -> str:
        return f"DeviceArray(shape={self.shape}, dtype={self.dtype}, ptr=0x{self.ptr:x})"

    def view(self, dtype=None, shape: Sequence[int] | None = None, offset: int = 0) -> "DeviceArray":
        """Reinterpret `shape`/`dtype` starting `offset` bytes in; must stay inside."""
        dtype = np.dtype(dtype or self.dtype)
        if shape is None:
            shape = ((self.nbytes - offset) // dtype.itemsize,)
        v = DeviceArray(self.gpu, self.ptr + offset, tuple(shape), dtype, self._owner)
        if offset < 0 or offset + v.nbytes > self.nbytes:
            raise CudaError(f"view [{offset}, {offset + v.nbytes}) outside {self.nbytes} bytes")
        return v

    def upload(self, host: np.ndarray) -> None:
        host = np.ascontiguousarray(host)
        if host.nbytes != self.nbytes:
            raise CudaError(f"upload of {host.nbytes} bytes into a {self.nbytes}-byte array")
        self.gpu._htod(self.ptr, host)

    def upload_async(self, host: np.ndarray) -> None:
        """Stream-ordered copy from host memory without waiting for it: `host` must be a
        pinned array (Gpu.pinned) that stays unchanged until the stream has passed the
        copy (a later read-back, sync or event); kernels launched after it see the data."""
        if host.nbytes != self.nbytes or not host.flags["C_CONTIGUOUS"]:
            raise CudaError(f"upload of {host.nbytes} bytes into a {self.nbytes}-byte array (C-contiguous)")
        self.gpu._htod(self.ptr, host, wait=False)

    def numpy(self) -> np.ndarray:
        """Copy to a new host array (synchronizes the stream)."""
        out = np.empty(self.shape, self.dtype)
        self.gpu._dtoh(out, self.ptr)
        return out

    def fill_bytes(self, byte: int) -> None:
        """memset every byte (stream-ordered; captured when inside g.capture())."""
        self.gpu._memset(self.ptr, byte, self.nbytes)

    def poison(self) -> None:
        """Fill with poison_byte(dtype): a value no kernel writes (NaN for floats, -128 for
        int8, ...). Checks poison outputs before each launch so an element the kernel never
        wrote cannot pass."""
        self.fill_bytes(poison_byte(self.dtype))

    def zero(self) -> None:
        self.fill_bytes(0)


def _attr(v) -> int:
    """A kernel attribute: a method in some cuda.core releases, a property in others."""
    return int(v() if callable(v) else v)


class Kernel:
    """A kernel function of a loaded module."""

    def __init__(self, module: "Module", name: str, ck):
        self.module = module
        self.name = name
        self._k = ck
        self._smem_limit = _SMEM_DEFAULT_LIMIT
        self._static: int | None = None

    @property
    def num_regs(self) -> int:
        return _attr(self._k.attributes.num_regs)

    @property
    def static_shared(self) -> int:
        """The kernel's static shared memory bytes (asked once)."""
        if self._static is None:
            self._static = _attr(self._k.attributes.shared_size_bytes)
        return self._static

    @property
    def local_bytes(self) -> int:
        """Stack frame / spill bytes per thread (0 for a healthy kernel)."""
        return _attr(self._k.attributes.local_size_bytes)

    def allow_shared(self, nbytes: int) -> None:
        """Raise the dynamic shared memory limit: needed when the dynamic bytes, or the dynamic
        and the static bytes together, pass 48 KiB (set then to at least 48 KiB, once)."""
        from cuda.bindings import driver

        if nbytes <= self._smem_limit and (self._smem_limit > _SMEM_DEFAULT_LIMIT
                                           or nbytes + self.static_shared <= _SMEM_DEFAULT_LIMIT):
            return
        nbytes = max(int(nbytes), _SMEM_DEFAULT_LIMIT + 1)
        attr = driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
        # cuda.core loads modules as libraries: the handle is a CUkernel, set per device
        h = self._k.handle
        if not isinstance(h, driver.CUkernel):
            h = driver.CUkernel(int(h))
        dev = driver.CUdevice(self.module.gpu.info.index)
        _drv(driver.cuKernelSetAttribute(attr, int(nbytes), h, dev), "cuKernelSetAttribute")
        self._smem_limit = nbytes

    def allow_nonportable_cluster(self) -> None:
        """Let this kernel launch in thread-block clusters of more than 8 blocks (up to 16 on sm_90;
        experiments only: no engine kernel launches as clusters)."""
        from cuda.bindings import driver

        attr = driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED
        h = self._k.handle
        if not isinstance(h, driver.CUkernel):
            h = driver.CUkernel(int(h))
        _drv(driver.cuKernelSetAttribute(attr, 1, h, driver.CUdevice(self.module.gpu.info.index)),
             "cuKernelSetAttribute")

    def set_carveout(self, percent: int) -> None:
        """The preferred shared-memory carveout (percent of the most shared memory an SM has):
        MEMRA_SMEM_CARVEOUT, a machine setting (docs/FLAGS.md) — one value for every kernel, so
        that consecutive kernels never ask an SM for another L1 / shared split."""
        from cuda.bindings import driver

        if not 0 <= percent <= 100:
            raise CudaError(f"MEMRA_SMEM_CARVEOUT must be a percentage 0..100, got {percent}")
        attr = driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT
        h = self._k.handle
        if not isinstance(h, driver.CUkernel):
            h = driver.CUkernel(int(h))
        _drv(driver.cuKernelSetAttribute(attr, int(percent), h, driver.CUdevice(self.module.gpu.info.index)),
             "cuKernelSetAttribute")

    def __repr__(self) -> str:
        return f"Kernel({self.module.kernel_file}:{self.name})"


class Module:
    def __init__(self, gpu: "Gpu", kernel_file: str, defines: dict, cubin: bytes):
        from cuda.core import ObjectCode

        self.gpu = gpu
        self.kernel_file = kernel_file
        self.defines = defines
        self._obj = ObjectCode.from_cubin(cubin, name=kernel_file)
        self._kernels: dict[str, Kernel] = {}

    def kernel(self, name: str) -> Kernel:
        k = self._kernels.get(name)
        if k is None:
            try:
                ck = self._obj.get_kernel(name)
            except Exception as e:
                raise CudaError(f"kernel {name!r} not found in {self.kernel_file}: {e}") from e
            k = self._kernels[name] = Kernel(self, name, ck)
            carve = os.environ.get("MEMRA_SMEM_CARVEOUT", "").strip()
            if carve:
                if not carve.isdigit():
                    raise CudaError(f"MEMRA_SMEM_CARVEOUT must be a percentage 0..100, got {carve!r}")
                k.set_carveout(int(carve))
        return k

    __getitem__ = kernel


class Graph:
    """An instantiated CUDA graph; filled in when the `g.capture()` block exits."""

    def __init__(self, gpu: "Gpu"):
        self.gpu = gpu
        self._exec = None

    def upload(self) -> None:
        """Stage the graph on the device before its first launch (which otherwise does it).
        Only for a graph launched right after (timing harnesses): on the H200 a graph uploaded
        and not yet launched made every graph captured after it ~9 % slower for good
        (experiments/prefill_graph_ab.py), so the runner never uploads ahead."""
        self._exec.upload(self.gpu.stream)

    def launch(self) -> None:
        self._exec.launch(self.gpu.stream)

    def close(self) -> None:
        if self._exec is not None:
            self._exec.close()
            self._exec = None


class Gpu:
    """One device: its context (made current), one stream, and the loaded modules.
    Get it with `gpu()`; everything is ordered on `self.stream`."""

    # its modules are NVRTC's CUBINs: a runner compiles its plan's ahead of use (memra.gpu.compile.AheadOfUse)
    compile_ahead = True

    def __init__(self, index: int = 0):
        if not has_gpu():
            raise CudaError("no CUDA GPU available (no driver or no device)")
        from cuda.core import Device

        self._dev = Device(index)
        self._dev.set_current()
        self.stream = self._dev.create_stream()
        self._target = self.stream          # a GraphBuilder while capturing
        self._mr = self._dev.memory_resource
        self._modules: dict[tuple, Module] = {}
        p = self._dev.properties
        from cuda.bindings import driver

        cc = (p.compute_capability_major, p.compute_capability_minor)
        self.info = DeviceInfo(
            index=index, name=self._dev.name, cc=cc, arch=arch_for(cc),
            sm_count=p.multiprocessor_count, l2_bytes=p.l2_cache_size,
            total_mem=int(_drv(driver.cuDeviceTotalMem(index), "cuDeviceTotalMem")),
            smem_per_block_optin=p.max_shared_memory_per_block_optin,
            driver_version=int(_drv(driver.cuDriverGetVersion(), "cuDriverGetVersion")),
        )
        log.debug("GPU %d: %s", index, self.info)

    def make_current(self) -> None:
        """Make this device's context current on the calling thread (a thread other than
        the one that first opened it, e.g. the server's engine thread)."""
        self._dev.set_current()

    # --- memory -------------------------------------------------------------------
    def empty(self, shape, dtype=np.uint8) -> DeviceArray:
        shape = (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
        nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
        buf = self._mr.allocate(max(nbytes, 1), stream=self.stream)
        return DeviceArray(self, int(buf.handle), shape, dtype, buf)

    def free_memory(self) -> int:
        """Bytes of device memory free now (cuMemGetInfo)."""
        from cuda.bindings import driver

        free, _total = _drv(driver.cuMemGetInfo(), "cuMemGetInfo")
        return int(free)

    def to_device(self, host: np.ndarray) -> DeviceArray:
        host = np.ascontiguousarray(host)
        a = self.empty(host.shape, host.dtype)
        a.upload(host)
        return a

    def _cu_stream(self):
        s = self._target.stream if self._target is not self.stream else self.stream
        return s.handle

    def _memset(self, ptr: int, byte: int, nbytes: int) -> None:
        from cuda.bindings import driver

        _drv(driver.cuMemsetD8Async(ptr, byte & 0xFF, nbytes, self._cu_stream()), "cuMemsetD8Async")

    def _htod(self, dst: int, host: np.ndarray, wait: bool = True) -> None:
        from cuda.bindings import driver

        if self._target is not self.stream:
            raise CudaError("host-to-device copies cannot be captured in a graph")
        _drv(driver.cuMemcpyHtoDAsync(dst, host.ctypes.data, host.nbytes, self.stream.handle),
             "cuMemcpyHtoDAsync")
        if wait:
            self.stream.sync()   # the host array may be freed right after: finish the copy

    def pinned(self, shape, dtype=np.uint8) -> np.ndarray:
        """A host array in page-locked memory (cuMemHostAlloc), freed with the array:
        DeviceArray.upload_async copies from it without staging and without waiting.
        CudaError where the driver refuses (e.g. a locked-memory limit)."""
        import ctypes
        import weakref

        from cuda.bindings import driver

        shape = (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
        nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
        ptr = int(_drv(driver.cuMemHostAlloc(max(nbytes, 1), 0), "cuMemHostAlloc"))
        if not ptr:
            raise CudaError("cuMemHostAlloc returned NULL")
        raw = (ctypes.c_ubyte * max(nbytes, 1)).from_address(ptr)
        weakref.finalize(raw, _free_host, ptr)
        return np.frombuffer(raw, np.uint8, nbytes).view(dtype).reshape(shape)

    def _dtoh(self, out: np.ndarray, src: int) -> None:
        from cuda.bindings import driver

        if self._target is not self.stream:
            raise CudaError("device-to-host copies cannot be captured in a graph")
        _drv(driver.cuMemcpyDtoHAsync(out.ctypes.data, src, out.nbytes, self.stream.handle),
             "cuMemcpyDtoHAsync")
        self.stream.sync()

    def copy(self, dst: DeviceArray, src: DeviceArray, nbytes: int | None = None) -> None:
        """Device-to-device copy on the stream (captured inside g.capture())."""
        from cuda.bindings import driver

        n = min(dst.nbytes, src.nbytes) if nbytes is None else nbytes
        _drv(driver.cuMemcpyDtoDAsync(dst.ptr, src.ptr, n, self._cu_stream()), "cuMemcpyDtoDAsync")

    # --- modules and launches ---------------------------------------------------------
    def module(self, kernel_file: str, defines: Mapping[str, object] | None = None) -> Module:
        """Compile (or take from the cubin cache) kernels/<kernel_file> for this device's
        arch with `defines` as -D macros, load it once per process."""
        from memra.gpu.compile import compile_cubin

        defines = dict(defines or {})
        key = (kernel_file, tuple(sorted((k, str(v)) for k, v in defines.items())))
        m = self._modules.get(key)
        if m is None:
            cubin = compile_cubin(kernel_file, self.info.arch, defines)
            m = self._modules[key] = Module(self, kernel_file, defines, cubin)
        return m

    def launch(self, kernel: Kernel, grid, block, args: Iterable, shmem: int = 0,
               pdl: bool = False) -> None:
        """Launch on the stream (or record into the graph being captured).

        args: DeviceArray (passed as its pointer) or numpy scalars (np.int32, np.float32,
        np.uint64, ...): plain Python numbers are refused so a value's C type is never guessed.
        pdl: programmatic dependent launch (sm_90+): the kernel may start while the previous
        one finishes; it must call MEMRA_PDL_WAIT() before reading what that one wrote."""
        from cuda.core import LaunchConfig, launch

        cargs = []
        for a in args:
            if isinstance(a, DeviceArray):
                cargs.append(np.uint64(a.ptr))
            elif isinstance(a, np.generic):
                cargs.append(a)
            else:
                raise TypeError(f"kernel {kernel.name}: argument {a!r} must be a DeviceArray "
                                f"or a numpy scalar")
        if shmem:
            kernel.allow_shared(shmem)
        cfg = LaunchConfig(grid=grid, block=block, shmem_size=int(shmem),
                           programmatic_stream_serialization=bool(pdl))
        try:
            launch(self._target, cfg, kernel._k, *cargs)
        except Exception as e:
            raise CudaError(f"launch of {kernel} grid={grid} block={block} failed: {e}") from e

    def sync(self) -> None:
        """Wait for the stream; raises CudaError for an asynchronous kernel fault."""
        try:
            self.stream.sync()
        except Exception as e:
            raise CudaError(f"GPU error surfaced at sync: {e}") from e

    # --- graphs ---------------------------------------------------------------------
    @contextmanager
    def capture(self):
        """Record launches, memsets and device copies made inside the block into a graph.
        Yields a Graph that becomes launchable when the block exits."""
        if self._target is not self.stream:
            raise CudaError("nested graph capture")
        graph = Graph(self)
        gb = self.stream.create_graph_builder()
        gb.begin_building()
        self._target = gb
        try:
            yield graph
        except BaseException:
            self._target = self.stream
            try:
                gb.end_building()
            finally:
                gb.close()
            raise
        self._target = self.stream
        try:
            graph._exec = gb.end_building().complete()
        except Exception as e:
            raise CudaError(f"graph instantiation failed: {e}") from e
        finally:
            gb.close()

    # --- timing -----------------------------------------------------------------------
    def time_ms(self, fn: Callable[[], None], reps: int = 50, warmup: int = 5) -> np.ndarray:
        """Per-repetition device time of fn() (ms), with CUDA events around each call."""
        from cuda.core import EventOptions

        for _ in range(warmup):
            fn()
        opts = EventOptions(timing_enabled=True)
        marks = [self.stream.record(options=opts)]
        for _ in range(reps):
            fn()
            marks.append(self.stream.record(options=opts))
        self.sync()
        return np.array([marks[i + 1] - marks[i] for i in range(reps)], np.float64)

    def copy_bandwidth(self, refresh: bool = False) -> float:
        """Measured device-to-device copy bandwidth in bytes/s (bytes read + bytes written),
        measured once per device and driver and cached in $MEMRA_HOME/device.json."""
        from memra.paths import device_json

        path = device_json()
        key = f"{self.info.name}|{self.info.driver_version}|{self.info.total_mem}"
        cache = {}
        if path.is_file():
            try:
                cache = json.loads(path.read_text())
            except (OSError, ValueError):
                cache = {}
        if not refresh and key in cache:
            return float(cache[key]["copy_bytes_per_s"])
        n = 1 << 30   # 1 GiB each way: far larger than any L2
        a, b = self.empty(n), self.empty(n)
        a.fill_bytes(0x5A)
        ms = self.time_ms(lambda: self.copy(b, a), reps=20, warmup=3)
        bw = 2 * n / (float(np.median(ms)) * 1e-3)
        del a, b
        cache[key] = {"copy_bytes_per_s": bw, "info": asdict(self.info)}
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps(cache, indent=1))
        os.replace(tmp, path)
        log.info("measured copy bandwidth on %s: %.0f GB/s", self.info.name, bw / 1e9)
        return bw


_GPUS: dict[int, Gpu] = {}
_CURRENT = threading.local()   # the device whose context this thread made current


def gpu(index: int = 0) -> Gpu:
    """The process-wide Gpu for device `index` (created on first use), its context made
    current on the calling thread: a thread other than the one that opened it (the
    server's engine thread, after tests or a CLI opened it on the main thread) must not
    run driver calls without a context."""
    g = _GPUS.get(index)
    if g is None:
        g = _GPUS[index] = Gpu(index)
    elif getattr(_CURRENT, "index", None) != index:
        g.make_current()
    _CURRENT.index = index
    return g
