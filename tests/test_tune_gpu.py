"""The GPU half of `memra tune` on a real GPU: a small campaign over norm.cu's rmsnorm
through memra.tune.measure's adapter, with a tune hook written here against the protocol the
ops families implement. The check's oracle is the numpy RMSNorm reference; the timing's is
physics (no kernel moves bytes faster than the device's measured copy bandwidth)."""

from __future__ import annotations

import math
import types

import numpy as np
import pytest

from memra.gpu import cuda

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not cuda.has_gpu(), reason="needs an NVIDIA GPU")]


class RmsnormCase:
    """tune_case for rmsnorm over `batch` rows of n floats (variant 'canary' is the
    deliberately wrong build kernel-check uses: its check must fail)."""

    def __init__(self, g, config, shape, rng, rotate_bytes, canary):
        from memra.cpu.reference import rms_norm

        self.g, self.rows, self.n = g, shape["batch"], shape["n"]
        self.threads = config["NORM_THREADS"]
        defines = dict(config, **({"MEMRA_CANARY": 1} if canary else {}))
        self.k = g.module("norm.cu", defines).kernel("rmsnorm")
        row_set = self.rows * self.n * 4
        self.bytes = 2 * row_set + self.n * 4  # read x and w, write out
        self.sets = max(1, math.ceil(rotate_bytes / (2 * row_set)))
        self.x = g.empty(self.sets * self.rows * self.n, np.float32)
        self.out = g.empty(self.sets * self.rows * self.n, np.float32)
        x0 = rng.standard_normal((self.rows, self.n), dtype=np.float32)
        w = rng.standard_normal(self.n, dtype=np.float32)
        self.w = g.to_device(w)
        self.x.upload(np.tile(x0.ravel(), self.sets))  # every copy holds real numbers
        self.expect = rms_norm(x0, w, 1e-6)

    def _arrays(self, i):
        off = i * self.rows * self.n * 4
        return (self.x.view(np.float32, (self.rows * self.n,), off),
                self.out.view(np.float32, (self.rows * self.n,), off))

    def launch(self, i):
        x, out = self._arrays(i)
        self.g.launch(self.k, (self.rows,), (self.threads,), (x, self.w, out, np.int32(self.n),
                                                              np.float32(1e-6), np.uint64(0), np.uint64(0)))

    def check(self):
        self.out.poison()
        self.launch(0)
        got = self._arrays(0)[1].numpy().reshape(self.rows, self.n)
        err = float(np.max(np.abs(got - self.expect) / (np.abs(self.expect) + 1e-6)))
        ok = bool(np.isfinite(got).all()) and err <= 1e-5
        return ok, err, "" if ok else f"max rel err {err:.3g} > 1e-5"


def test_campaign_on_the_gpu(tmp_path, monkeypatch):
    from memra.tune import campaign as C
    from memra.tune import measure as tune_gpu
    from memra.tune.receipts import read_receipts
    from memra.tune.freeze import freeze

    hook = types.SimpleNamespace(tune_case=lambda g, kernel, variant, config, shape, rng, rot:
                                 RmsnormCase(g, config, shape, rng, rot, variant == "canary"))
    monkeypatch.setattr(tune_gpu, "family_module", lambda src: hook)
    spec = {"name": "gpu-test", "batches": [1, 4], "kernels": [{
        "name": "rmsnorm", "src": "norm.cu", "variants": ["default", "canary"],
        "grid": {"NORM_THREADS": [128, 512]}, "shapes": [{"n": 4096}]}]}
    jobs = C.expand_campaign(spec)
    g = cuda.gpu()
    ctx = tune_gpu.device_context(g)
    out = tmp_path / "r.jsonl"
    counts = C.run_campaign(jobs, tune_gpu.gpu_measure(g, reps=30, seed=1), out, context=ctx)
    assert counts == {"measured": 4, "failed": 4, "skipped": 0}

    df = read_receipts(out)
    good, bad = df[df["ok"]], df[~df["ok"]]
    assert set(good["variant"]) == {"default"} and set(bad["variant"]) == {"canary"}
    assert bad["median_us"].isna().all() and (bad["max_err"] > 1e-5).all()
    peak = ctx["peak_gbps"]
    for r in good.itertuples():
        assert 0 < r.p20_us <= r.median_us <= r.p80_us and r.reps == 30
        assert 1.0 < r.gbps <= 1.1 * peak, (r.gbps, peak)
        assert r.max_err <= 1e-5
    from memra.gpu.compile import source_hash

    assert set(df["device"]) == {g.info.name} and set(df["src_hash"]) == {source_hash("norm.cu")}
    table = freeze(df, g.info.name)
    for b in ("1", "4"):
        e = table["entries"]["rmsnorm"]["n=4096"][b]
        assert e["variant"] == "default" and e["candidates"] == 2 and e["failed"] == 2
