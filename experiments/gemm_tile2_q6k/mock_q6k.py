"""mock_q6k.py — experiments/gemm_tile/mock_gpu.py's CPU stand-in for memra.gpu.cuda.Gpu, for
`run.py --mock`, with Q6_K weights: memra's gemm_q8 launches dequantize their planes as Q6_K (bulk 192,
meta 18 bytes a super-block), and gemm_tile_q6k / gemm_tile_q6k_reduce are emulated by their contract
in float64 (y = W x, or the split-K parts ws[z][b][n] and their sum in z order). Inside the timing loop
(emulate = False) launches only check their arguments, as in mock_gpu.
"""
from __future__ import annotations

import numpy as np

from mock_gpu import MockGpu
from memra.gpu.ops import matvec as MV

Q6_K = 14


class MockQ6Gpu(MockGpu):
    def _weight(self, bulk, meta, rows, K):
        b = self._arr(bulk, rows * K // 256 * 192, np.uint8).reshape(rows, -1)
        m = self._arr(meta, rows * K // 256 * 18, np.uint8).reshape(rows, -1)
        return MV.dequant_rows(MV.unpack_planes(b, m, Q6_K), Q6_K).astype(np.float64)

    def launch(self, kernel, grid, block, args, shmem=0, pdl=False):
        n = kernel.name
        if n not in ("gemm_tile_q6k", "gemm_tile_q6k_reduce"):
            return super().launch(kernel, grid, block, args, shmem, pdl)
        from memra.gpu.cuda import DeviceArray
        for a in args:
            if not isinstance(a, (DeviceArray, np.generic)):
                raise TypeError(f"mock: kernel {n}: argument {a!r} is neither a DeviceArray nor a numpy scalar")
        if shmem > 232448 or int(np.prod(block)) > 1024:
            raise RuntimeError(f"mock: {n} block {block} shmem {shmem} over the limits")
        self.launches.append((n, tuple(grid), tuple(block), int(shmem)))
        if n == "gemm_tile_q6k":
            bulk, meta, xq, xs, y, N, K, nb, ks = args
            N, K, nb, ks = int(N), int(K), int(nb), int(ks)
            assert grid[2] == ks and K % 512 == 0 and (K // 256) % ks == 0, (grid, K, ks)
            if not self.emulate:
                self._arr(y, (ks if ks > 1 else 1) * nb * N, np.float32)   # bounds only
                return
            w = self._weight(bulk, meta, N, K)
            xv = self._acts(xq, xs, nb, K)
            if ks == 1:
                self._arr(y, nb * N, np.float32)[:] = MV.matvec_ref(w, xv, None, None).astype(np.float32).ravel()
            else:
                kc = K // ks
                parts = np.stack([xv[:, z * kc:(z + 1) * kc] @ w[:, z * kc:(z + 1) * kc].T for z in range(ks)])
                self._arr(y, ks * nb * N, np.float32)[:] = parts.astype(np.float32).ravel()
        else:
            ws, y, N, nb, ks = args
            N, nb, ks = int(N), int(nb), int(ks)
            if not self.emulate:
                self._arr(ws, ks * nb * N, np.float32)
                return
            p = self._arr(ws, ks * nb * N, np.float32).reshape(ks, nb, N).astype(np.float64).sum(0)
            self._arr(y, nb * N, np.float32)[:] = p.astype(np.float32).ravel()
