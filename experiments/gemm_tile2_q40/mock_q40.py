"""mock_q40: experiments/gemm_tile/mock_gpu.py's CPU stand-in for memra's Gpu, extended for run.py --mock:
the kernels of gemm_tile2_q40.cu (gemm_q40 / gemm_q40_glu / gemm_q80 / gemm_q80_glu / gemm_tile_reduce)
and memra's gemm_q8 / gemm_q8_glu for any planes type (MV_TYPE of the module's defines), emulated from
their argument lists in float64 (the contracts, not the code).
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "gemm_tile"))
import mock_gpu as base  # noqa: E402
from memra.gpu.ops import matvec as MV  # noqa: E402

KERNEL_TYPES = {"gemm_q40": 2, "gemm_q40_glu": 2, "gemm_q80": 8, "gemm_q80_glu": 8}


class MockKernel(base.MockKernel):
    def __init__(self, name, defines):
        super().__init__(name)
        self.defines = defines


class MockModule(base.MockModule):
    def kernel(self, name):
        return MockKernel(name, self.defines)


class MockGpu(base.MockGpu):
    def module(self, file, defines=None):
        if file not in ("gemm.cu", "q8.cu"):
            raise RuntimeError(f"mock: no emulation for {file}")
        return MockModule(file, defines)

    def copy(self, dst, src, nbytes=None):
        n = min(dst.nbytes, src.nbytes) if nbytes is None else nbytes
        self._at(dst.ptr, n)[:] = self._at(src.ptr, n)

    def _weight_t(self, bulk, meta, rows, K, qt):
        _, blk, bb, bo, bl = MV.TYPES[qt]
        b = self._arr(bulk, rows * K // blk * bl, np.uint8).reshape(rows, -1)
        m = self._arr(meta, rows * K // blk * (bb - bl), np.uint8).reshape(rows, -1)
        return MV.dequant_rows(MV.unpack_planes(b, m, qt), qt).astype(np.float64)

    def launch(self, kernel, grid, block, args, shmem=0, pdl=False):
        n = kernel.name
        if n not in KERNEL_TYPES and n not in ("gemm_q8", "gemm_q8_glu"):
            return super().launch(kernel, grid, block, args, shmem, pdl)
        for a in args:
            if not isinstance(a, (base.DeviceArray, np.generic)):
                raise TypeError(f"mock: kernel {n}: argument {a!r} is neither a DeviceArray nor a numpy scalar")
        if shmem > 232448 or int(np.prod(block)) > 1024:
            raise RuntimeError(f"mock: {n} block {block} shmem {shmem} over the limits")
        self.launches.append((n, tuple(grid), tuple(block), int(shmem)))
        if not self.emulate:
            return
        glu = n.endswith("glu")
        if n in KERNEL_TYPES:
            bulk, meta, xq, xs, y, N, K, nb, ks = args
            N, K, nb, ks = int(N), int(K), int(nb), int(ks)
            qt = KERNEL_TYPES[n]
            assert int(kernel.defines.get("GT_QT", 2)) == qt, "module type != kernel name"
            assert grid[2] == ks, (grid, ks)
            rows = 2 * N if glu else N
            w = self._weight_t(bulk, meta, rows, K, qt)
            xv = self._acts(xq, xs, nb, K)
            if ks == 1:
                out = MV.matvec_ref(w, xv, None, "silu" if glu else None)
                self._arr(y, nb * N, np.float32)[:] = out.astype(np.float32).ravel()
            else:
                kc = K // ks
                parts = np.stack([xv[:, z * kc:(z + 1) * kc] @ w[:, z * kc:(z + 1) * kc].T for z in range(ks)])
                self._arr(y, ks * nb * rows, np.float32)[:] = parts.astype(np.float32).ravel()
        else:
            bulk, meta, xq, xs, y, res, N, K, nb, act = args
            N, K, nb = int(N), int(K), int(nb)
            qt = int(kernel.defines["MV_TYPE"])
            w = self._weight_t(bulk, meta, 2 * N if glu else N, K, qt)
            out = MV.matvec_ref(w, self._acts(xq, xs, nb, K), None, "silu" if glu else None)
            self._arr(y, nb * N, np.float32)[:] = out.astype(np.float32).ravel()
