"""The emulator's launch-geometry check (tests/gpu_emulator.py `check_geometry`): which output
elements a launch writes comes from the grid, block and dynamic shared memory the launcher
passes and the launch contract in the kernel's header, so launcher bugs that the numpy
kernel models would paper over (they compute whole outputs whatever the grid) fail here.

The mutations patch a launcher (memra.gpu.ops.*) the way a real bug would change it and
assert the emulator refuses the launch; the unpatched launchers pass the same launches."""

from __future__ import annotations

import numpy as np
import pytest

import gpu_emulator as EMU
from gpu_emulator import FakeGpu
from memra.errors import CudaError
from memra.gpu.ops import act as ACT
from memra.gpu.ops import matvec as MV
from memra.gpu.q8 import Q8_SCALE, quantize_q8_ref

N, K = 203, 512  # 203 rows: a partial last block for every rows-per-block above 1


def _matvec(g, t=12, nb=1, config=None, q8=True):
    rng = np.random.default_rng(0)
    raw = MV.random_weight(t, N, K, rng)
    w = MV.upload_weight(g, raw, t)
    x = rng.standard_normal((nb, K)).astype(np.float32)
    y = g.empty((nb, N), np.float32)
    y.poison()
    if q8:
        xq, xs = g.empty((nb, K), np.int8), g.empty((nb, K // 32), Q8_SCALE)
        MV.quantize_q8(g, g.to_device(x), xq, xs, nb)
        MV.matvec(g, w, y, xq=xq, xs=xs, nb=nb, config=config)
        q, s = quantize_q8_ref(x)
        xv = (q.reshape(nb, -1, 32).astype(np.float64) * s["d"][..., None]).reshape(nb, K)
    else:
        MV.matvec(g, w, y, x=g.to_device(x), nb=nb, config=config)
        xv = x
    return y.numpy(), MV.matvec_ref(MV.dequant_rows(raw, t), xv)


@pytest.mark.parametrize("q8", [True, False])
def test_matvec_geometry_passes_as_launched(q8):
    got, ref = _matvec(FakeGpu(1 << 24), nb=3 if q8 else 1, q8=q8)
    assert np.all(np.isfinite(got)) and np.allclose(got, ref, rtol=1e-5, atol=1e-4)


def test_tail_dropping_matvec_grid_is_caught(monkeypatch):
    """The mutation of issue 16: the grid by floor division drops the rows of the partial
    last block (203 = 25 * 8 + 3 with the default 8 rows a block)."""
    monkeypatch.setattr(MV, "grid_for", lambda n, cfg: n // MV.rows_per_block(cfg))
    with pytest.raises(CudaError, match=r"mv_q8 grid .* 3 of 203 elements of y .* written by no block"):
        _matvec(FakeGpu(1 << 24))
    with pytest.raises(CudaError, match="written by no block"):
        _matvec(FakeGpu(1 << 24), q8=False)


def test_matvec_block_and_shared_memory_follow_the_module():
    g = FakeGpu(1 << 24)
    xs_cfg = {"MV_NWARPS": 8, "MV_ROWS": 2, "MV_KSPLIT": 1, "MV_UNROLL": 1, "MV_XSMEM": 1}
    _matvec(g, config=xs_cfg)  # the right dynamic shared memory: passes
    real = MV.xsmem_bytes
    try:
        MV.xsmem_bytes = lambda nb, k: real(nb, k) - 1024  # one tile's scales short
        with pytest.raises(CudaError, match="dynamic shared memory"):
            _matvec(g, config=xs_cfg)
    finally:
        MV.xsmem_bytes = real


def test_block_size_other_than_the_module_is_caught(monkeypatch):
    g = FakeGpu(1 << 24)
    x = g.to_device(np.ones((2, 300), np.float32))
    real = g.launch
    monkeypatch.setattr(g, "launch", lambda k, grid, block, args, shmem=0, pdl=False:
                        real(k, grid, (128,), args, shmem, pdl))  # ACT_THREADS is 256
    with pytest.raises(CudaError, match=r"act_mul .*the block must be \(256,\)"):
        ACT.act_mul(g, x, x, x, 300, 2, "silu")


def test_act_and_quantize_tails(monkeypatch):
    """Floor-division grids of the elementwise launchers are caught the same way."""
    g = FakeGpu(1 << 24)
    x = g.to_device(np.ones((1, 300), np.float32))
    ACT.softcap(g, x, 300, 30.0)  # 300 = 256 + 44: two blocks, as launched
    real = g.launch
    monkeypatch.setattr(g, "launch", lambda k, grid, block, args, shmem=0, pdl=False:
                        real(k, (grid[0] - 1,) + tuple(grid[1:]), block, args, shmem, pdl))
    with pytest.raises(CudaError, match="44 of 300 elements of x .* written by no block"):
        ACT.softcap(g, x, 300, 30.0)
    xq, xs = g.empty(3 * 320, np.int8), g.empty(3 * 10, Q8_SCALE)
    with pytest.raises(CudaError, match=r"quantize_q8 grid .* 6 of 30 elements of the q8 blocks"):
        MV.quantize_q8(g, g.to_device(np.ones((3, 320), np.float32)), xq, xs, 3)


def test_the_checker_counts_overlaps_and_holes():
    k = EMU.FakeKernel("any", {})
    with pytest.raises(CudaError, match="2 of 10 elements of out are written by two blocks"):
        EMU._ranges(k, (3, 1, 1), (32, 1, 1), "out", 10, [0, 4, 6], 4)
    with pytest.raises(CudaError, match="2 of 10 elements of out are written by no block"):
        EMU._ranges(k, (2, 1, 1), (32, 1, 1), "out", 10, [0, 4], 4)
    EMU._ranges(k, (3, 1, 1), (32, 1, 1), "out", 10, [0, 4, 8], 4)


def test_gemm_geometry_and_its_tail(monkeypatch):
    """The tensor-core GEMM's grid covers the rows and the batch columns (200 = 3 * 64 + 8
    rows; 33 columns: a partial tile); a launcher rounding down drops a tail, caught."""
    from memra.gpu.ops import gemm as GEMM

    g = FakeGpu(1 << 25)
    rng = np.random.default_rng(1)
    raw = MV.random_weight(12, 200, 512, rng)
    w = MV.upload_weight(g, raw, 12)
    xq, xs = g.empty((33, 512), np.int8), g.empty((33, 16), Q8_SCALE)
    MV.quantize_q8(g, g.to_device(rng.standard_normal((33, 512)).astype(np.float32)), xq, xs, 33)
    y = g.empty((33, 200), np.float32)
    GEMM.gemm(g, w, y, xq=xq, xs=xs, nb=33)
    assert np.all(np.isfinite(y.numpy()))
    real = GEMM.launch_shape

    def floor_rows(t, cfg, N, nb, glu):
        grid, block, smem = real(t, cfg, N, nb, glu)
        obm = cfg["GM_WM"] * cfg["GM_TM"] * 16 // (2 if glu else 1)
        return (N // obm, grid[1]), block, smem

    monkeypatch.setattr(GEMM, "launch_shape", floor_rows)
    with pytest.raises(CudaError, match=r"gemm_q8 grid .* elements of y's rows \(200\) are written by no block"):
        GEMM.gemm(g, w, y, xq=xq, xs=xs, nb=33)
    monkeypatch.setattr(GEMM, "launch_shape", lambda *a: (real(*a)[0], real(*a)[1], real(*a)[2] - 16))
    with pytest.raises(CudaError, match="dynamic shared memory"):
        GEMM.gemm(g, w, y, xq=xq, xs=xs, nb=33)
