"""memra profile's breakdown on the emulated GPU: every launch of the plan's decode step is
recorded and timed once, in plan order, with the bytes its launch reads."""

from __future__ import annotations

import numpy as np

from gpu_emulator import FakeGpu
from memra.gpu.runner import Runner
from memra.tune.profile import by_kernel, profile


class TimedGpu(FakeGpu):
    """The emulator with a clock: every timed call runs fn once and reports 10 µs."""

    def time_ms(self, fn, reps=50, warmup=5):
        fn()
        return np.full(reps, 0.01)


def test_profile_covers_the_plan_in_order(tiny_models):
    path = tiny_models("llama", "Q4_K_M")
    r = Runner(path, max_len=96, max_seqs=3, kv_tokens=3 * 96, gpu=TimedGpu(1 << 28))
    doc = profile(r, rows=3, depth=20, reps=2)
    plan = r.plan.step(4, decode=True, sampler="greedy")  # 3 rows run in the 4-row bucket
    assert [x["name"] for x in doc["launches"]] == [L.name for L in plan]
    assert all(x["launches"] >= 1 and x["us"] == 5.0 for x in doc["launches"])  # 10 µs per graph of 2 copies
    # a matvec reads its weight once per launch (the hand count: the tensor's GGUF bytes)
    out = next(x for x in doc["launches"] if x["name"] == "output")
    w = r.W["output"]
    assert w.nbytes == w.rows * w.K // 256 * 210  # Q6_K blocks of 256 values in 210 bytes
    assert out["bytes"] >= w.nbytes
    # and multiplies it by the 4 rows of the bucket: 2 * rows * K * 4 operations in 5 µs
    assert out["ops"] == 2 * w.rows * w.K * 4 and out["tops"] == round(out["ops"] / 5.0 / 1e6, 2)
    assert all(x["ops"] == 0 and x["tops"] is None for x in doc["launches"] if x["op"] not in ("matvec", "mvt", "gemm"))
    # attention at depth 20 reads 21 keys of K and V per row
    att = next(x for x in doc["launches"] if x["name"] == "blk.0.attention")
    assert att["bytes"] >= 4 * 21 * 2 * r.cfg.kv_dim * 2
    s = by_kernel(doc["launches"])
    assert sum(g["count"] for g in s) == len(plan)
    assert sum(g["ops"] for g in s) == sum(x["ops"] for x in doc["launches"])
    assert abs(sum(g["total_us"] for g in s) - doc["sum_us"]) < 1e-6
    # the sequences the profile opened are closed again
    assert r.kv.alloc.n_free == r.kv.alloc.n_blocks


def test_prefill_profile_times_the_chunk_of_its_bucket(tiny_models):
    """--prefill: one chunk of 20 token rows after 8 cached ones, profiled at its bucket
    (32 rows, the captured graph the runner replays) launch by launch, with the eager cost."""
    path = tiny_models("llama", "Q4_K_M")
    r = Runner(path, max_len=96, max_seqs=1, kv_tokens=96, gpu=TimedGpu(1 << 28))
    doc = profile(r, rows=20, depth=8, reps=2, prefill=True)
    assert doc["prefill"] and doc["bucket"] == 32 and doc["step_us"] == 10.0 and doc["eager_us"] == 10.0
    plan = r.plan.step(32, decode=False)
    assert [x["name"] for x in doc["launches"]] == [L.name for L in plan]
    assert not any(x["op"] in ("argmax", "sample") for x in doc["launches"])  # no head in a chunk
    assert r.kv.alloc.n_free == r.kv.alloc.n_blocks


def test_decode_profile_of_many_rows_fits_the_cli_context(tiny_models):
    """A decode step of `rows` sequences at `depth` needs depth + 2 positions per sequence
    (and the 16 steps the decode graph reserves), not depth + rows: 16 sequences at depth 80
    fit a context of 96."""
    path = tiny_models("llama", "Q4_K_M")
    r = Runner(path, max_len=96, max_seqs=16, kv_tokens=16 * 96, gpu=TimedGpu(1 << 28))
    doc = profile(r, rows=16, depth=80, reps=1)
    assert doc["rows"] == 16 and not doc["prefill"]


def test_profile_times_the_attention_switch_kind_the_step_launches(tiny_models, monkeypatch):
    """With the attention switch, a decode step launches the short module, the long one or both by its rows' key
    counts: the profile records the launches of the step's own kind (its graph's), not both."""
    monkeypatch.setenv("MEMRA_ATT_SWITCH", "30")
    path = tiny_models("llama", "Q4_K_M")
    r = Runner(path, max_len=96, max_seqs=2, kv_tokens=2 * 96, gpu=TimedGpu(1 << 28))
    for depth, kind, names in ((10, "short", {"blk.0.attention"}), (40, "long", {"blk.0.attention_long"})):
        doc = profile(r, rows=1, depth=depth, reps=2)
        assert [x["name"] for x in doc["launches"]] == \
            [L.name for L in r.plan.step(1, decode=True, sampler="greedy", att_kind=kind)]
        assert {x["name"] for x in doc["launches"] if x["name"].startswith("blk.0.attention")} == names
