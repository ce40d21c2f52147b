"""Constrained decode with the mask filled while the device runs the step (Row.mask = LATER,
Runner.step's fill callback; the scheduler's default) against masks filled before the step.

Oracle: the synchronous path (masks given up front), itself checked against the sampling rule
over masked logits in tests/test_structured.py. Both paths run on the emulated GPU (decode
graph replay and eager launches); the fill is asserted to run after the step's body has
written the logits and before the sampler has chosen a token, and the masks to travel by the
asynchronous upload from the runner's host buffer."""

from __future__ import annotations

import numpy as np
import pytest

from memra.model.gguf import open_gguf
from memra.text.grammar import allowed, compile_constraint, fill_masks, new_masks
from memra.text.tokenizer import Tokenizer
from test_forced import run_requests

SCHEMA = {"type": "object", "properties": {
    "id": {"type": "integer", "minimum": 1, "maximum": 99},
    "tags": {"type": "array", "maxItems": 2, "items": {"enum": ["a", "bc"]}},
    "ok": {"type": "boolean"}},
    "required": ["id", "tags", "ok"], "additionalProperties": False}


@pytest.fixture(scope="module")
def setup(tiny_models):
    from gpu_emulator import FakeGpu

    from memra.gpu.runner import Runner

    path = tiny_models("llama", "Q4_K_M")
    tok = Tokenizer.from_gguf(open_gguf(path))
    g = FakeGpu(1 << 28)
    return Runner(path, gpu=g, max_len=64, max_seqs=4), g, tok, compile_constraint(tok, "json_schema", SCHEMA)


def _decode(r, g, tok, con, steps: int, overlap: bool, graph: bool):
    """Three rows (constrained greedy, constrained seeded, free greedy) decoding `steps`
    tokens; a finished document starts over (its matcher reset)."""
    from memra.gpu.runner import LATER, Row, Sampling

    sets = [Sampling(0.0), Sampling(0.9, 20, 0.95, 0.02, 7), Sampling(0.0)]
    prompts = [tok.encode(p, add_special=False) for p in ("JSON:", "An object:", "free")]
    seqs = [r.open() for _ in prompts]
    matchers = [con.matcher(), con.matcher()]
    words = new_masks(3, tok.n_vocab)
    calls = []
    try:
        feed = prompts
        toks = []
        for step in range(steps):
            decode = step > 0
            fed = [f[-1] for f in feed]

            def fill(buf, fed=fed, decode=decode):
                calls.append(buf.shape)
                if decode:  # the body has run (logits written), the sampler has not (tokens as fed)
                    assert np.isfinite(r.buf["logits"].numpy()[:3]).all()
                    assert list(r.r_tok.numpy()[:3]) == fed
                fill_masks([(m, i) for i, m in enumerate(matchers)], buf)

            if overlap:
                rows = [Row(s, f, sample=st, mask=LATER if i < 2 else None)
                        for i, (s, f, st) in enumerate(zip(seqs, feed, sets))]
                if decode:
                    r.buf["logits"].poison()  # NaN until the body writes them
                out = r.step(rows, graph=graph, fill=fill)
            else:
                fill_masks([(m, i) for i, m in enumerate(matchers)], words)
                rows = [Row(s, f, sample=st, mask=words[i] if i < 2 else None)
                        for i, (s, f, st) in enumerate(zip(seqs, feed, sets))]
                out = r.step(rows, graph=graph)
            got = [o.token for o in out]
            for m, t in zip(matchers, got):
                assert m.consume(t), m.error
                if m.stopped:
                    m.m.reset()
            toks.append(got)
            feed = [[t] for t in got]
    finally:
        for s in seqs:
            r.close(s)
    return toks, calls


@pytest.mark.parametrize("graph", [True, pytest.param(False, marks=pytest.mark.slow)], ids=["graph", "eager"])
def test_overlapped_fill_gives_the_synchronous_tokens(setup, graph):
    r, g, tok, con = setup
    steps = 10
    sync, _ = _decode(r, g, tok, con, steps, overlap=False, graph=graph)
    up0 = g.async_uploads
    late, calls = _decode(r, g, tok, con, steps, overlap=True, graph=graph)
    assert late == sync
    assert calls == [(3, r.mask_words)] * steps  # one fill a step (the prefill's before it)
    assert g.async_uploads - up0 >= steps - 1  # the decode steps' masks: no waiting upload
    assert any(t[0] != t[2] for t in sync)  # the constraint changed something


def test_later_masks_need_a_fill_and_only_mask_constrained_rows(setup):
    from memra.errors import MemraError
    from memra.gpu.runner import LATER, Row, Sampling

    r, g, tok, con = setup
    a, b = r.open(), r.open()
    try:
        with pytest.raises(MemraError, match="fill"):
            r.step([Row(a, [5], sample=Sampling(0.0), mask=LATER)])
        assert a.n == 0
        r.step([Row(a, [5, 6]), Row(b, [7, 8])])
        raw = r.step([Row(a, [9], logits="last"), Row(b, [10], logits="last")])
        r.rewind(a, 2)
        r.rewind(b, 2)
        m = con.matcher()

        def fill(buf):
            fill_masks([(m, 0)], buf)

        # row b asks for logits only: its mask is not applied to what comes back
        out = r.step([Row(a, [9], sample=Sampling(0.0), mask=LATER), Row(b, [10], logits="last")], fill=fill)
        ok = allowed(_mask_of(m, tok), tok.n_vocab)
        assert ok[out[0].token] and out[0].token == int(np.argmax(np.where(ok, raw[0].logits, -np.inf)))
        np.testing.assert_array_equal(out[1].logits, raw[1].logits)
    finally:
        r.close(a)
        r.close(b)


def _mask_of(m, tok):
    w = new_masks(1, tok.n_vocab)
    fill_masks([(m, 0)], w)
    return w[0]


@pytest.mark.slow
def test_scheduler_overlap_on_and_off_agree(tiny_models, monkeypatch):
    """Constrained (greedy and seeded) and free requests sharing decode steps through the
    scheduler on the emulated runner: the same tokens with the masks filled during the step
    (default) and before it (MEMRA_MASK_OVERLAP=0), and the CPU engine's tokens for the
    greedy ones."""
    from gpu_emulator import FakeGpu

    from memra.gpu.runner import Runner
    from memra.sampling import SamplingParams
    from memra.serve.cpu_engine import CpuRunner
    from memra.serve.scheduler import GenRequest, Scheduler

    path = tiny_models("llama", "Q4_K_M")
    tok = Tokenizer.from_gguf(open_gguf(path))
    con = compile_constraint(tok, "json_schema", SCHEMA)
    prompts = [tok.encode(p, add_special=False) for p in ("Give JSON:", "An object please", "free text")]

    def run(engine, overlap: bool):
        monkeypatch.setenv("MEMRA_MASK_OVERLAP", "1" if overlap else "0")
        sched = Scheduler(engine, tok, max_queue=8, max_batched_tokens=64)
        assert sched.overlap_masks is overlap
        reqs = [GenRequest(prompts[0], SamplingParams(temperature=0, max_tokens=8), constraint=con),
                GenRequest(prompts[1], SamplingParams(temperature=0.9, seed=3, max_tokens=8), constraint=con),
                GenRequest(prompts[2], SamplingParams(temperature=0, max_tokens=8), ignore_eos=True)]

        return [out for out, _ in run_requests(sched, reqs)]

    runner = Runner(path, gpu=FakeGpu(1 << 28), max_len=64, max_seqs=4)
    on = run(runner, True)
    off = run(runner, False)
    assert on == off
    cpu = run(CpuRunner(open_gguf(path), max_len=64, max_seqs=4), True)
    assert cpu[0] == on[0] and cpu[2] == on[2]


def test_fill_masks_row_by_row_equals_llguidances_pool(setup, monkeypatch):
    """MEMRA_MASK_THREADS=1 (the default: rows one by one) and 2 (llguidance's LLExecutor)
    write the same masks, and leave rows not named alone."""
    _, _, tok, con = setup
    ms = [con.matcher() for _ in range(3)]
    assert ms[1].consume_all(tok.encode('{"id": 4', add_special=False))
    assert ms[2].consume_all(tok.encode('{"id": 12, "tags": [', add_special=False))
    got = {}
    for threads in ("1", "2"):
        monkeypatch.setenv("MEMRA_MASK_THREADS", threads)
        w = new_masks(5, tok.n_vocab)
        fill_masks([(m, i + 1) for i, m in enumerate(ms)], w)
        got[threads] = w
    np.testing.assert_array_equal(got["1"], got["2"])
    assert (got["1"][0] == -1).all() and (got["1"][4] == -1).all()
    assert len({got["1"][i].tobytes() for i in (1, 2, 3)}) == 3
