"""The tune hook of kernels/q8.cu (activation quantization to int8 per 32, launched by
memra.gpu.ops.matvec.quantize_q8; its reference quantize_q8_ref is in memra.gpu.q8).

memra/tune/measure.py finds a family's hook in memra/gpu/ops/<kernel file stem>.py: this
module is that place for q8.cu. Kernel "quantize_q8", variant "default", shape {n: K} (the width
of the quantized activation), batch = rows; grid {Q8_WARPS}. The check is bit-exact.
"""

from __future__ import annotations

import numpy as np

from memra.errors import MemraError
from memra.gpu.q8 import Q8_SCALE, quantize_q8_ref
from memra.gpu.ops.matvec import quantize_q8


# the kernels tune_case measures and their variants (memra tune run checks a campaign's names against them)
TUNE_VARIANTS = {"quantize_q8": ("default",)}


def tune_case(g, kernel: str, variant: str, config: dict, shape: dict, rng, rotate_bytes: int):
    if variant not in TUNE_VARIANTS.get(kernel, ()):
        raise MemraError(f"q8 tune: unknown kernel/variant {kernel}/{variant}")
    K = int(shape["n"])
    if K % 32:
        raise MemraError(f"quantize_q8: n = {K} is not a multiple of 32")
    return _TuneCase(g, dict(config or {}), K, int(shape.get("batch", 1)), rng, rotate_bytes)


class _TuneCase:
    """`sets` copies of the f32 input [rows, K]; one int8/scale output, as in the engine
    (one twin buffer serves every matvec input)."""

    def __init__(self, g, config, K, rows, rng, rotate_bytes):
        self.g, self.config, self.K, self.rows = g, config, K, rows
        one = rows * K * 4
        self.sets = max(1, -(-rotate_bytes // one))
        self.x = (rng.standard_normal((rows, K)) * rng.uniform(0.5, 4)).astype(np.float32)
        self.x[0, :32] = 0.0  # an all-zero block (d = 0, q = 0)
        self.buf = g.to_device(np.tile(self.x.reshape(1, -1), (self.sets, 1)))
        self.xq = g.empty((rows, K), np.int8)
        self.xs = g.empty((rows, K // 32), Q8_SCALE)
        self.bytes = one + rows * K + rows * K // 32 * Q8_SCALE.itemsize

    def launch(self, i: int) -> None:
        x = self.buf.view(np.float32, (self.rows, self.K), 4 * self.rows * self.K * i)
        quantize_q8(self.g, x, self.xq, self.xs, self.rows, config=self.config)

    def check(self):
        self.xq.poison()
        self.xs.poison()
        self.launch(0)
        self.g.sync()
        q, s = quantize_q8_ref(self.x)
        got_q, got_s = self.xq.numpy(), self.xs.numpy()
        bad = (int(np.count_nonzero(got_q != q)),
               int(np.count_nonzero(got_s["d"].view(np.uint32) != s["d"].view(np.uint32))),
               int(np.count_nonzero(got_s["s"] != s["s"])))
        ok = not any(bad)
        with np.errstate(invalid="ignore"):
            err = float(np.nanmax(np.abs(got_q.astype(np.int32) - q.astype(np.int32)))) if not ok else 0.0
        return ok, err, "bit-exact" if ok else f"q: {bad[0]}, d: {bad[1]}, s: {bad[2]} of {q.size}/{s.size} differ"
