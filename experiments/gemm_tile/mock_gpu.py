"""A CPU stand-in for memra.gpu.cuda.Gpu, for `tile.py --mock`: runs the device script's host
logic (uploads through memra's upload_weight / DeviceArray, launches through memra's gemm and
quantize_q8 launchers and tile.py's own, argument lists, workspace sizes, read-backs, checks,
timing loop, table) without a GPU. Memory is numpy; DeviceArray (memra's class) works on it
through _htod / _dtoh / _memset. Launches are emulated from their argument lists in float64
(the kernels' contracts, not their code): gemm_tile / gemm_tile_glu (incl. split-K partials),
gemm_tile_reduce, memra's gemm_q8 / gemm_q8_glu and quantize_q8. Inside the timing loop
(emulate = False) launches only check their arguments.
"""
from __future__ import annotations

import bisect
import time

import numpy as np

from memra.gpu.cuda import DeviceArray
from memra.gpu.ops import matvec as MV
from memra.gpu.q8 import Q8_SCALE, quantize_q8_ref


class _Info:
    name, arch, index = "mock (CPU)", "sm_90a", 0


class _Event:
    def __init__(self):
        self.t = time.perf_counter()

    def __sub__(self, other):
        return (self.t - other.t) * 1e3


class _Stream:
    def record(self, options=None):
        return _Event()

    def sync(self):
        pass


class MockKernel:
    def __init__(self, name):
        self.name = name


class MockModule:
    def __init__(self, file, defines):
        self.file, self.defines = file, dict(defines or {})

    def kernel(self, name):
        return MockKernel(name)


class MockGpu:
    def __init__(self):
        self.info = _Info()
        self.stream = _Stream()
        self.bases, self.mem = [], {}
        self.next = 1 << 20
        self.emulate = True
        self.launches = []

    # memory
    def empty(self, shape, dtype=np.uint8):
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        n = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
        base = self.next
        self.next += (max(n, 16) + 255) // 256 * 256 + 256
        self.mem[base] = np.zeros(max(n, 16), np.uint8)
        bisect.insort(self.bases, base)
        return DeviceArray(self, base, shape, dtype, None)

    def to_device(self, host):
        a = self.empty(host.shape, host.dtype)
        a.upload(host)
        return a

    def _at(self, ptr: int, n: int) -> np.ndarray:
        i = bisect.bisect_right(self.bases, ptr) - 1
        if i < 0:
            raise RuntimeError(f"mock: address 0x{ptr:x} not allocated")
        base = self.bases[i]
        buf = self.mem[base]
        off = ptr - base
        if off + n > buf.size:
            raise RuntimeError(f"mock: access [{off}, {off + n}) outside an allocation of {buf.size} bytes")
        return buf[off:off + n]

    def _htod(self, dst, host, wait=True):
        self._at(dst, host.nbytes)[:] = np.ascontiguousarray(host).view(np.uint8).ravel()

    def _dtoh(self, out, src):
        out.view(np.uint8).ravel()[:] = self._at(src, out.nbytes)

    def _memset(self, ptr, byte, nbytes):
        self._at(ptr, nbytes)[:] = byte

    def sync(self):
        pass

    def module(self, file, defines=None):
        if file not in ("gemm.cu", "q8.cu"):
            raise RuntimeError(f"mock: no emulation for {file}")
        return MockModule(file, defines)

    # launches
    def _arr(self, a, n, dtype):
        ptr = a.ptr if isinstance(a, DeviceArray) else int(a)
        return self._at(ptr, n * np.dtype(dtype).itemsize).view(dtype)

    def _weight(self, bulk, meta, rows, K):
        b = self._arr(bulk, rows * K // 2, np.uint8).reshape(rows, K // 2)
        m = self._arr(meta, rows * K // 16, np.uint8).reshape(rows, K // 16)
        return MV.dequant_rows(MV.unpack_planes(b, m, 12), 12).astype(np.float64)

    def _acts(self, xq, xs, nb, K):
        q = self._arr(xq, nb * K, np.int8).reshape(nb, K).astype(np.float64)
        s = self._arr(xs, nb * K // 32, Q8_SCALE).reshape(nb, K // 32)
        return (q.reshape(nb, -1, 32) * s["d"].astype(np.float64)[..., None]).reshape(nb, K)

    def launch(self, kernel, grid, block, args, shmem=0, pdl=False):
        for a in args:
            if not isinstance(a, (DeviceArray, np.generic)):
                raise TypeError(f"mock: kernel {kernel.name}: argument {a!r} is neither a DeviceArray nor a numpy scalar")
        if shmem > 232448 or int(np.prod(block)) > 1024:
            raise RuntimeError(f"mock: {kernel.name} block {block} shmem {shmem} over the limits")
        self.launches.append((kernel.name, tuple(grid), tuple(block), int(shmem)))
        if not self.emulate:
            return
        n = kernel.name
        if n in ("gemm_tile", "gemm_tile_glu"):
            bulk, meta, xq, xs, y, N, K, nb, ks = args
            N, K, nb, ks = int(N), int(K), int(nb), int(ks)
            glu = n.endswith("glu")
            rows = 2 * N if glu else N
            assert grid[2] == ks, (grid, ks)
            w = self._weight(bulk, meta, rows, K)
            xv = self._acts(xq, xs, nb, K)
            if ks == 1:
                out = MV.matvec_ref(w, xv, None, "silu" if glu else None)
                self._arr(y, nb * N, np.float32)[:] = out.astype(np.float32).ravel()
            else:
                kc = K // ks
                parts = np.stack([xv[:, z * kc:(z + 1) * kc] @ w[:, z * kc:(z + 1) * kc].T for z in range(ks)])
                self._arr(y, ks * nb * rows, np.float32)[:] = parts.astype(np.float32).ravel()
        elif n == "gemm_tile_reduce":
            ws, y, N, nb, ks, glu = args
            N, nb, ks, glu = int(N), int(nb), int(ks), int(glu)
            rows = 2 * N if glu else N
            p = self._arr(ws, ks * nb * rows, np.float32).reshape(ks, nb, rows).astype(np.float64).sum(0)
            out = p[:, :N] / (1 + np.exp(-p[:, :N])) * p[:, N:] if glu else p
            self._arr(y, nb * N, np.float32)[:] = out.astype(np.float32).ravel()
        elif n in ("gemm_q8", "gemm_q8_glu"):
            bulk, meta, xq, xs, y, res, N, K, nb, act = args
            N, K, nb = int(N), int(K), int(nb)
            glu = n.endswith("glu")
            w = self._weight(bulk, meta, 2 * N if glu else N, K)
            out = MV.matvec_ref(w, self._acts(xq, xs, nb, K), None, "silu" if glu else None)
            self._arr(y, nb * N, np.float32)[:] = out.astype(np.float32).ravel()
        elif n == "quantize_q8":
            x, xq, xs, nblocks = args
            nv = int(nblocks) * 32
            q, s = quantize_q8_ref(self._arr(x, nv, np.float32).reshape(-1, 32))
            self._arr(xq, nv, np.int8)[:] = q.ravel()
            self._arr(xs, int(nblocks), Q8_SCALE)[:] = s.ravel()
        else:
            raise RuntimeError(f"mock: no emulation for kernel {n}")
