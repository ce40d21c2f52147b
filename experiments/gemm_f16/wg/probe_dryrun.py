"""probe.py's host code run on the CPU against a numpy stand-in of the device (no GPU, no kernels run): catches
a slip in the probe's Python (argument lists, views, the smoke subprocess's bookkeeping, the records) before
a device call is spent on it. The stand-in computes every gemm_f16 / gemm_f16_wg launch as float64 products of
the f16-rounded operands rounded to f32 (so the probe's checks pass when its bookkeeping is right), to_f16 as
numpy's astype; timings are 1.0 µs; the tile's launches do nothing. Shapes are shrunk.

    python3 experiments/gemm_f16/wg/probe_dryrun.py          # ~1 min; prints the records, exit 0 when all ok
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

import numpy as np

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "experiments" / "gemm_f16"))
sys.path.insert(0, str(ROOT / "experiments" / "gemm_tile"))

import probe  # noqa: E402
import tile as TL  # noqa: E402
from memra.gpu import cuda as CU  # noqa: E402
from memra.gpu.ops import gemm_tile as GT  # noqa: E402
from memra.gpu.ops import matvec as MV  # noqa: E402
from memra.model import quants as Q  # noqa: E402


class Arr:
    def __init__(self, a: np.ndarray, owner=None):
        self.a, self.owner = a, owner

    def numpy(self):
        return self.a.copy()

    def poison(self):
        self.a.view(np.uint8)[...] = 0xFF

    def view(self, dtype=None, shape=None, offset=0):
        flat = self.a.reshape(-1).view(np.uint8)[offset:]
        v = flat.view(dtype or self.a.dtype)
        return Arr(v[:int(np.prod(shape))].reshape(shape) if shape else v, self.owner)


class FakeGpu:
    info = SimpleNamespace(name="numpy stand-in")

    def empty(self, shape, dtype=np.uint8):
        return Arr(np.zeros(shape, dtype))

    def to_device(self, host):
        return Arr(np.ascontiguousarray(host).copy())

    def sync(self):
        pass

    def launch(self, kernel, grid, block, args, shmem=0, pdl=False):
        name = kernel.name
        if name == "to_f16":
            x, h, n = args
            h.a.reshape(-1)[:int(n)] = x.a.reshape(-1)[:int(n)].astype(np.float16).view(np.uint16)
            return
        if name == "gemm_f16_glu":
            bulk, meta, xh, y, N, K, nb, act = args
            res = None
        else:
            bulk, meta, xh, y, res, N, K, nb = args
            res = None if isinstance(res, np.generic) else res
        N, K, nb = int(N), int(K), int(nb)
        wt = bulk.owner
        obm = kernel.bm // 2 if name.endswith("glu") else kernel.bm
        assert grid[1] * obm == N and grid[0] == -(-nb // kernel.bn), (name, grid, N, nb)
        assert block[0] == kernel.nt and shmem == kernel.smem
        wf = wt.deq(2 * N if name.endswith("glu") else N)
        x16 = xh.a.reshape(-1)[:nb * K].view(np.float16).reshape(nb, K).astype(np.float64)
        prod = x16 @ wf.T
        if name.endswith("glu"):
            g, u = prod[:, :N].astype(np.float32), prod[:, N:].astype(np.float32)
            out = (g / (np.float32(1) + np.exp(-g))) * u
        else:
            out = prod.astype(np.float32)
            if res is not None:
                out = res.a.reshape(-1)[:nb * N].reshape(nb, N) + out
        y.a.reshape(-1)[:nb * N] = out.astype(np.float32).reshape(-1)


class FakeWeight:
    def __init__(self, raw, t):
        self.raw, self.t, self._deq = raw, t, None
        self.bulk, self.meta = Arr(np.zeros(1, np.uint8), self), Arr(np.zeros(1, np.uint8), self)

    def deq(self, rows):
        if self._deq is None:
            K = self._k()
            self._deq = Q.dequantize(self.raw, self.t, (self.raw.shape[0], K)).astype(np.float16).astype(np.float64)
        return self._deq[:rows]

    def _k(self):
        name, blk, bb, _, _ = MV.TYPES[self.t]
        return self.raw.shape[1] // bb * blk


class FakeModule:
    def __init__(self, kernel_file, defines):
        self.file, self.defines = kernel_file, defines

    def kernel(self, name):
        d = self.defines
        nt, bm, bn, smem = (probe.wg_geom if self.file == "gemm_f16_wg.cu" else probe.geom)(d)
        return SimpleNamespace(name=name, nt=nt, bm=bm, bn=bn, smem=smem)


def main() -> int:
    fake = FakeGpu()
    CU.gpu = lambda *a, **k: fake
    MV.upload_weight = lambda g, raw, t: FakeWeight(raw, t)
    MV.quantize_q8 = lambda *a, **k: None
    GT.gemm_tile = lambda *a, **k: None
    TL.time_us = lambda g, fns, reps, launches=24: ([f() for f in fns], 1.0)[1]
    TL.prebuilt_module = lambda g, cache, k, kernel_file, defines, cubin, mock=False: FakeModule(kernel_file, defines)
    probe.SHAPES = [("gate_up", probe.Q4_K, 2 * 512, 1024, True), ("down", probe.Q6_K, 512, 2048, False),
                    ("gate_up", probe.Q4_0, 2 * 512, 512, True), ("qkv", probe.Q8_0, 512, 512, False)]

    real_run = subprocess.run

    def run(cmd, **kw):   # the smoke subprocess, in this process (it needs the stand-in)
        if "--wg-smoke" in cmd:
            argv = sys.argv
            sys.argv = [str(probe.__file__)] + [str(c) for c in cmd[2:]]
            try:
                rc = probe.main()
            finally:
                sys.argv = argv
            return subprocess.CompletedProcess(cmd, rc, "", "")
        return real_run(cmd, **kw)

    probe.subprocess.run = run
    out = Path(tempfile.mkdtemp()) / "dry.jsonl"
    sys.argv = [str(probe.__file__), "--out", str(out), "--reps", "2"]
    rc = probe.main()
    recs = [json.loads(line) for line in out.read_text().splitlines()]
    bad = [r for r in recs if r.get("ok") is False or "error" in r or r.get("rc") not in (None, 0)]
    kinds = {}
    for r in recs:
        kinds[r["kind"]] = kinds.get(r["kind"], 0) + 1
    print(f"probe rc {rc}; records {kinds}; not ok: {len(bad)}")
    for r in bad[:10]:
        print(json.dumps(r)[:600])
    return 1 if (rc or bad) else 0


if __name__ == "__main__":
    sys.exit(main())
