"""matvec and the q8 activation quantizer on the GPU: kernel-check (every type, batch
bucket, family, epilogue, against float64 references; canaries caught), batch invariance,
and a CUDA graph replay identical to eager launches."""

from __future__ import annotations

import numpy as np
import pytest

from memra.gpu import cuda

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not cuda.has_gpu(), reason="needs an NVIDIA GPU")]


def test_kernel_check_matvec():
    from memra.tune.kernelcheck import all_green, run_kernel_check

    lines = list(run_kernel_check(only="matvec"))
    assert all_green(lines), "\n".join(l for l in lines if not l.startswith("PASS"))
    assert sum(" canary " in l and "caught" in l for l in lines) == 3


@pytest.mark.parametrize("t", [2, 12, 14])
def test_batch_invariant_and_graph_replay(t):
    from memra.gpu.ops import matvec as M

    g = cuda.gpu()
    rng = np.random.default_rng(7)
    N, K = 300, 1024
    w = M.upload_weight(g, M.random_weight(t, N, K, rng), t)
    x = rng.standard_normal((8, K)).astype(np.float32)
    xd = g.to_device(x)
    xq, xs = g.empty((8, K), np.int8), g.empty((8, K // 32), M.Q8_SCALE)
    M.quantize_q8(g, xd, xq, xs, 8)
    ys = {}
    for nb in (1, 3, 8):
        y = g.empty((nb, N), np.float32)
        y.poison()
        M.matvec(g, w, y, xq=xq, xs=xs, nb=nb)
        g.sync()
        ys[nb] = y.numpy()
    # row 0 bit-identical whatever else is in the batch
    assert np.array_equal(ys[1][0], ys[3][0]) and np.array_equal(ys[1][0], ys[8][0])
    assert np.array_equal(ys[3], ys[8][:3])
    y = g.empty((1, N), np.float32)
    with g.capture() as graph:
        y.poison()
        M.matvec(g, w, y, xq=xq, xs=xs, nb=1)
    graph.upload()
    for _ in range(3):
        graph.launch()
    g.sync()
    assert np.array_equal(y.numpy(), ys[1])
