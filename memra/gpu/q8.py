"""The q8 activation format shared by every family: int8 values per 32 with one
`Q8_SCALE` (d: f32 scale, s: sum of the int8s) per block, as struct Q8Scale in
kernels/q8.cuh. The dp4a matvecs read it; quantize_q8 (memra.gpu.ops.matvec) and the fused
norm / attention epilogues write it ("the q8 twin" of their output).

`quantize_q8_ref` is the reference of every writer; `q8_twin_matches` is the one bit check.
"""

from __future__ import annotations

import numpy as np

# per-32 activation block scale, as struct Q8Scale in kernels/q8.cuh
Q8_SCALE = np.dtype([("d", "<f4"), ("s", "<i4")])


def quantize_q8_ref(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The kernel's rule: per 32, d = amax/127 (f32), q = rint(x/d) (f32 division, half to
    even), s = sum(q). Returns (q int8 [.., K], scales Q8_SCALE [.., K/32])."""
    x = np.asarray(x, np.float32)
    blocks = x.reshape(*x.shape[:-1], -1, 32)
    amax = np.max(np.abs(blocks), axis=-1, keepdims=True)
    d = amax / np.float32(127)
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.where(amax == 0, np.float32(0), np.rint(blocks / d))
    q = q.astype(np.int8)
    s = np.empty(d.shape[:-1], Q8_SCALE)
    s["d"] = d[..., 0]
    s["s"] = q.astype(np.int32).sum(-1)
    return q.reshape(x.shape), s


def q8_twin_matches(xq, xs, y: np.ndarray) -> bool:
    """Whether the device arrays xq / xs hold quantize_q8_ref(y) bit for bit: the check of
    every kernel that writes its output's q8 twin."""
    q, s = quantize_q8_ref(y)
    return np.array_equal(xq.numpy().reshape(q.shape), q) and \
        np.array_equal(xs.numpy().reshape(s.shape).view(np.uint8), s.view(np.uint8))
