"""MV_TWIN: the gate+up matvec writing the q8 twin of its output (kernels/matvec.cu mv_q8_glu_twin; the emulator
models it), so a decode step drops the quantize launch before down. On
the CPU emulator: the launcher's refusals, the twin's bits against quantize_q8's, kernel-check's case catching a
wrong twin, and the engine's step with a table entry choosing it (the launch gone, the tokens and a row's bits
unchanged)."""

from __future__ import annotations

import numpy as np
import pytest

import gpu_emulator as EMU
from gpu_emulator import FakeGpu
from memra.errors import MemraError
from memra.gpu.ops import matvec as MV
from memra.gpu.q8 import Q8_SCALE, quantize_q8_ref
from memra.gpu.runner import Runner
from memra.tune.invariance import batch_invariance
from memra.tune.receipts import shape_key

TWIN = {"MV_NWARPS": 8, "MV_ROWS": 4, "MV_TWIN": 1}


def _cfg(extra, N=96, K=256, t=3):
    """A launch's whole configuration: the built-in default with `extra` laid over it."""
    return {**MV.default_config(t, "q8", N, K, 1, True), **extra}


def _glu(g, rng, N=96, K=256, t=3, nb=2):
    raw = MV.random_weight(t, 2 * N, K, rng)
    w = MV.upload_weight(g, raw, t)
    x = (rng.standard_normal((nb, K)) * 2).astype(np.float32)
    xq, xs = g.empty((nb, K), np.int8), g.empty((nb, K // 32), Q8_SCALE)
    MV.quantize_q8(g, g.to_device(x), xq, xs, nb)
    return w, xq, xs


def test_the_twin_is_quantize_q8_of_the_output():
    g, rng = FakeGpu(1 << 26), np.random.default_rng(0)
    w, xq, xs = _glu(g, rng)
    y = g.empty((2, 96), np.float32)
    tq, ts = g.empty((2, 96), np.int8), g.empty((2, 3), Q8_SCALE)
    MV.matvec(g, w, y, xq=xq, xs=xs, nb=2, glu="silu", config=_cfg(TWIN), twin=(tq, ts))
    g.sync()
    q, s = quantize_q8_ref(y.numpy())
    assert (tq.numpy() == q).all() and (ts.numpy().view(np.uint8) == s.view(np.uint8)).all()


def test_the_launcher_refuses_what_the_kernel_cannot_do():
    g, rng = FakeGpu(1 << 26), np.random.default_rng(1)
    w, xq, xs = _glu(g, rng)
    y = g.empty((2, 96), np.float32)
    tw = (g.empty((2, 96), np.int8), g.empty((2, 3), Q8_SCALE))
    with pytest.raises(MemraError, match="needs MV_TWIN 1"):
        MV.matvec(g, w, y, xq=xq, xs=xs, nb=2, glu="silu", config=_cfg({"MV_NWARPS": 8, "MV_ROWS": 4}), twin=tw)
    with pytest.raises(MemraError, match="own 32"):
        MV.matvec(g, w, y, xq=xq, xs=xs, nb=2, glu="silu", config=_cfg({**TWIN, "MV_ROWS": 2}), twin=tw)
    w40, xq40, xs40 = _glu(g, rng, N=40)
    with pytest.raises(MemraError, match="own 32"):
        MV.matvec(g, w40, g.empty((2, 40), np.float32), xq=xq40, xs=xs40, nb=2, glu="silu", config=_cfg(TWIN, N=40),
                  twin=(g.empty((2, 40), np.int8), g.empty((2, 2), Q8_SCALE)))
    with pytest.raises(MemraError, match="q8 GLU launch"):
        MV.matvec(g, w, g.empty((2, 192), np.float32), xq=xq, xs=xs, nb=2, glu=None, config=_cfg(TWIN), twin=tw)


def test_kernel_check_catches_a_wrong_twin(monkeypatch):
    """A twin case checks the output against the reference and the twin against quantize_q8 of it, bit for bit:
    an emulated kernel whose twin is off by one code fails."""
    case = {"file": MV.KERNEL_FILE, "entry": "mv_q8_glu_twin", "bucket": 1,
            "defines": {"MV_TYPE": 3, "MV_B": 1, **_cfg(TWIN, 1536, 576)},
            "params": {"type": 3, "N": 1536, "K": 576, "nb": 1, "glu": "silu", "q8": True, "res": False, "twin": True}}
    o = MV.check_launch(FakeGpu(1 << 27), np.random.default_rng(0), case)
    assert o.ok and "twin bit-exact" in o.detail, o.detail
    real = EMU._mv

    def off_by_one(g, k, grid, v):
        real(g, k, grid, v)
        if k.name == "mv_q8_glu_twin":
            q = g.mem(v[-2], np.int8, 1)
            q[0] = q[0] + 1 if q[0] < 127 else q[0] - 1

    monkeypatch.setattr(EMU, "_mv", off_by_one)
    o = MV.check_launch(FakeGpu(1 << 27), np.random.default_rng(0), case)
    assert not o.ok and "differ from quantize_q8" in o.detail


def test_a_table_entry_takes_the_quantize_launch_out_of_the_step(tiny_models):
    """gate+up's batch-1 entry with MV_TWIN: the one-row step has no ffn_q8 launch (gate+up writes the twin, down
    reads it), other buckets keep theirs; a sequence's greedy tokens alone (the twin) equal those among 9
    co-runners (bucket 16: quantize_q8), and the CPU reference's."""
    path = tiny_models("llama", "Q4_K_M")
    base = Runner(path, gpu=FakeGpu(1 << 28), max_len=96, max_seqs=16)
    gu = next(L for L in base.plan.step(1, decode=True) if L.name == "blk.0.gate_up")
    table = {"entries": {"matvec_glu": {shape_key(gu.shape): {"1": {"variant": "q8", "config": TWIN}}}}}
    r = Runner(path, gpu=FakeGpu(1 << 28), max_len=96, max_seqs=16, tune_table=table)
    one = r.plan.step(1, decode=True)
    assert r.plan.ffn_twin and not any(L.kernel == "quantize_q8" and "ffn_q8" in L.name for L in one)
    assert all(L.args.get("q8_out") for L in one if L.group == "gate_up")
    assert all(L.args.get("q8_src") == "ffn" for L in one if L.group == "down")
    assert sum("ffn_q8" in L.name for L in r.plan.step(4, decode=True)) == r.cfg.n_layer
    res = batch_invariance(r, [1, 17, 2398, 11, 905, 33, 4020, 8, 64, 1200], n_steps=5, co=9)
    assert res["identical"], res
    ref = batch_invariance(base, [1, 17, 2398, 11, 905, 33, 4020, 8, 64, 1200], n_steps=5, co=9)
    assert res["tokens_alone"] == ref["tokens_alone"]
