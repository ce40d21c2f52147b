"""Forced runs through captured graphs and the cost policy that decides how they are fed
(memra.gpu.runner.Runner.verify with masks, memra.text.grammar.FeedCosts).

The contract stays the one of tests/test_forced.py: the tokens never change. Oracles:
- Runner.verify with masks against masked decode steps one position at a time (the
  emulated GPU's decode graph, and the CPU engine's step): the same token at every row, and
  the same logits;
- the same code with MEMRA_FORCED=0 (every position its own sampled step);
- FeedCosts' choice against its formula with injected times.

The model is a tiny synthetic llama with SmolLM2's vocabulary (random weights: the
constraint makes the output valid)."""

from __future__ import annotations


import numpy as np
import pytest

from memra.model.gguf import open_gguf
from memra.sampling import SamplingParams
from memra.text.grammar import FeedCosts, allowed, fill_masks, new_masks, one_hot

# path, tok, con: test_forced's module fixtures (the tiny llama Q4_K_M, its tokenizer, the schema)
from test_forced import GREEDY, PENALIZED, SEEDED, _plain_host, con, path, run_requests, tok  # noqa: F401

PROMPT = [1, 17, 2398, 11, 905, 33, 4020, 8, 64, 1200]


@pytest.fixture(scope="module")
def runner(path):
    from gpu_emulator import FakeGpu

    from memra.gpu.runner import Runner

    return Runner(path, gpu=FakeGpu(1 << 28), max_len=160, max_seqs=4)


def _masks(tok, con, n):
    """n mask rows as a constrained verification gets them: a matcher's masks along a walk
    (several tokens allowed), a one-hot row, every token allowed (-1 words)."""
    m = con.matcher()
    out = new_masks(n, tok.n_vocab)
    rng = np.random.default_rng(5)
    for i in range(n):
        if i % 3 == 2:
            continue  # all allowed
        fill_masks([(m, i)], out)
        ok = np.flatnonzero(allowed(out[i], tok.n_vocab))
        t = int(rng.choice(ok))
        if i % 3 == 1:
            out[i] = one_hot([t], tok.n_vocab)[0]
        assert m.consume(t)
    return out


# -- Runner.verify with masks ------------------------------------------------------------------------

@pytest.mark.parametrize("sm", [(0.0,), (0.9, 20, 0.95, 0.02, 7)], ids=["greedy", "seeded"])
def test_verify_with_masks_is_masked_decode_at_every_position(runner, tok, con, sm):
    """Emulated GPU: verify(tokens, masks) chooses at row i what a masked decode step (its
    graph) chooses after tokens[:i+1] under masks[i]; the logits it returns are that step's
    masked logits; replaying the captured graph gives the same; masks=None is unchanged
    (the unmasked decode tokens)."""
    from memra.gpu.runner import Row, Sampling

    s = Sampling(*sm)
    feed = [5, 800, 31, 2047, 9, 77]
    masks = _masks(tok, con, len(feed))
    a = runner.open()
    try:
        runner.step([Row(a, PROMPT)])
        n0 = a.n
        want, want_lg, free = [], [], []
        for t, m in zip(feed, masks):
            o = runner.step([Row(a, [t], sample=s, mask=m, logits="last")])[0]
            runner.rewind(a, a.n - 1)
            free.append(runner.step([Row(a, [t], sample=s)])[0].token)
            want.append(o.token)
            want_lg.append(o.logits)
        assert all(allowed(m, tok.n_vocab)[w] for m, w in zip(masks, want))
        assert want != free  # the masks changed something
        for rep in range(2):  # the second call replays the captured graph
            runner.rewind(a, n0)
            assert runner.verify(a, feed, s, masks=masks) == want, rep
            assert a.n == n0 + len(feed)
        runner.rewind(a, n0)  # with the logits: the model's (unmasked), decode's bits
        out, lg = runner.verify(a, feed, s, masks=masks, logits="all")
        assert out == want
        np.testing.assert_array_equal(lg[:, :], np.stack(want_lg))
        assert np.isfinite(lg).all()
        runner.rewind(a, n0)
        assert runner.verify(a, feed, s) == free
        assert ("verify", len(feed), s.greedy and "greedy+mask" or "sample+mask") in {k[:3] for k in runner._graphs}
    finally:
        runner.close(a)


def test_cpu_engine_verify_with_masks_is_its_masked_step(path, tok, con):
    """The CPU engine's verify under masks = its masked step one position at a time."""
    from memra.gpu.runner import Row, Sampling
    from memra.serve.cpu_engine import CpuRunner

    eng = CpuRunner(open_gguf(path), max_len=64, max_seqs=2)
    s = Sampling(0.9, 20, 0.95, 0.02, 3)
    feed = [5, 800, 31, 2047]
    masks = _masks(tok, con, len(feed))
    a = eng.open()
    eng.step([Row(a, PROMPT)])
    n0 = a.n
    want = [eng.step([Row(a, [t], sample=s, mask=m)])[0].token for t, m in zip(feed, masks)]
    eng.rewind(a, n0)
    forced = feed[:1] + want[:-1]  # drafts equal to the choices: nothing stops early
    assert eng.verify(a, forced, s, masks=masks)[:1] == want[:1]
    eng.rewind(a, n0)
    got = []
    for t, m in zip(feed, masks):
        got += eng.verify(a, [t], s, masks=[m])
    assert got == want


# -- FeedCosts ------------------------------------------------------------------------------------------

def test_feed_costs_choose_by_measured_time_per_token():
    """Injected times: drip when the joint call costs more per token fed than the decode
    graph, the joint call when it costs less; unmeasured: the joint call (to measure it);
    each (path, size)'s first time dropped; every PROBE-th drip probes the joint call."""
    c = FeedCosts()
    assert c.choose([4], 0, "verify") == "verify"  # nothing measured
    for kind, n, t in (("graph", 1, 9.0), ("graph", 1, 0.55e-3), ("eager", 4, 9.0), ("eager", 4, 7e-3)):
        c.observe(kind, n, t)
    assert c.estimate("graph", 1) == pytest.approx(0.55e-3) and c.estimate("eager", 4) == pytest.approx(7e-3)
    assert c.choose([4], 0, "eager") == "drip"  # 7 ms / 4 tokens > 0.55 ms / 1
    c.observe("verify", 4, 1.0)
    c.observe("verify", 4, 0.7e-3)
    assert c.choose([4], 0, "verify") == "verify"  # 0.7 ms / 4 < 0.55 ms
    # three runs of 9 beside 7 other rows: (t_graph(8) + t_eager(27 rows: bucket 32)) per
    # 7 + 27 tokens fed vs t_graph(10 rows: bucket 16) per 10
    for n, t in ((16, 1.0), (16, 2.0e-3), (8, 1.0), (8, 1.9e-3), (32, 1.0), (32, 9e-3)):
        c.observe("graph" if n != 32 else "eager", n, t)
    assert c.choose([9, 9, 9], 7, "eager") == "drip"  # (1.9 + 9) / 34 > 2.0 / 10 ms
    for _ in range(3):
        c.observe("eager", 27, 1e-3)
    assert c.estimate("eager", 32) == pytest.approx(4.375e-3)  # the EMA: 9 -> 7 -> 5.5 -> 4.375
    assert c.choose([9, 9, 9], 7, "eager") == "eager"  # (1.9 + 4.375) / 34 < 2.0 / 10
    # an unmeasured bucket of decode rows takes the nearest measured one
    assert c.estimate("graph", 64) == c.estimate("graph", 16)
    slow = FeedCosts()
    for kind, n, t in (("graph", 1, 1.0), ("graph", 1, 1e-3), ("eager", 4, 1.0), ("eager", 4, 1.0)):
        slow.observe(kind, n, t)
    picks = [slow.choose([4], 0, "eager") for _ in range(2 * FeedCosts.PROBE)]
    assert picks.count("eager") == 2 and picks[FeedCosts.PROBE - 1] == "eager"
    assert FeedCosts(fixed="joint").choose([4], 0, "eager") == "eager"


def test_forced_always_fixes_the_joint_call(monkeypatch):
    monkeypatch.setenv("MEMRA_FORCED", "always")
    c = FeedCosts()
    for kind, n, t in (("graph", 1, 1.0), ("graph", 1, 1e-3), ("eager", 4, 1.0), ("eager", 4, 1.0)):
        c.observe(kind, n, t)
    assert c.choose([4], 0, "eager") == "eager"


# -- the scheduler ----------------------------------------------------------------------------------------

def _serve(engine, tok, reqs, monkeypatch, forced: str, times=None):
    """GenRequests through a Scheduler with MEMRA_FORCED=forced; times: {path: seconds}
    injected as every measured call's time. Returns (tokens per request, scheduler)."""
    from memra.serve.scheduler import Scheduler

    monkeypatch.setenv("MEMRA_FORCED", forced)
    sched = Scheduler(engine, tok, max_queue=8, max_batched_tokens=64)
    if times is not None:
        real = sched.costs.observe
        sched.costs.observe = lambda path, n, s: real(path, n, times[path])

    res = [out for out, _ in run_requests(sched, reqs)]
    return res, sched


def _counting(engine):
    """Count the engine's step and verify calls (and the verified row counts, in "lens")."""
    calls = {"step": 0, "verify": 0, "lens": []}
    for name in ("step", "verify"):
        orig = getattr(engine, name)

        def counted(*a, _orig=orig, _name=name, **kw):
            calls[_name] += 1
            if _name == "verify":
                calls["lens"].append(len(a[1]))
            return _orig(*a, **kw)

        setattr(engine, name, counted)
    return calls


def _uncount(engine):
    for name in ("step", "verify"):
        engine.__dict__.pop(name, None)


@pytest.mark.parametrize("kw", [pytest.param(GREEDY, marks=pytest.mark.slow), SEEDED], ids=["greedy", "seeded"])
def test_scheduler_alone_feeds_forced_runs_through_verify(runner, tok, con, kw, monkeypatch):
    """One constrained request alone on the emulated GPU: its forced runs are verification
    steps (no eager multi-token step after the prompt); the tokens are MEMRA_FORCED=0's, in
    far fewer model calls."""
    from memra.serve.scheduler import GenRequest

    prompt = tok.encode("Give JSON:", add_special=False)

    def req():
        return [GenRequest(prompt, SamplingParams(max_tokens=80, **kw), constraint=con)]

    calls = _counting(runner)
    try:
        (off,), _ = _serve(runner, tok, req(), monkeypatch, "0")
        n_off = dict(calls)
        calls.update(step=0, verify=0, lens=[])
        (on,), sched = _serve(runner, tok, req(), monkeypatch, "always")
        n_on = dict(calls)
    finally:
        _uncount(runner)
    assert on == off and len(on) > 20
    assert n_off["verify"] == 0 and n_on["verify"] == sched.costs.taken["verify"] >= 3
    assert sched.costs.taken["eager"] == 0 and sched.costs.taken["drip"] == 0
    assert n_on["step"] + n_on["verify"] < (n_off["step"] + n_off["verify"]) // 2


def test_scheduler_drips_when_the_joint_call_is_measured_slower(runner, tok, con, monkeypatch):
    """Injected times (a verification step 20x a decode step), one request alone: after the
    first two verification steps (one dropped, one measured) the forced runs are fed a
    token a decode step (drip); the tokens stay MEMRA_FORCED=0's."""
    from memra.serve.scheduler import GenRequest

    prompt = tok.encode("Give JSON:", add_special=False)

    def req():
        return [GenRequest(prompt, SamplingParams(max_tokens=60, **SEEDED), constraint=con)]

    off, _ = _serve(runner, tok, req(), monkeypatch, "0")
    calls = _counting(runner)
    try:
        on, sched = _serve(runner, tok, req(), monkeypatch, "1", {"graph": 1e-3, "verify": 20e-3, "eager": 20e-3})
    finally:
        _uncount(runner)
    t = sched.costs.taken
    assert on == off and t["drip"] >= 3 and t["eager"] == 0, t
    # a row count is verified while nothing was measured (its first time is dropped: the
    # graph's capture), twice at most; once measured slower the runs drip
    assert t["verify"] == calls["verify"] and max(map(calls["lens"].count, calls["lens"])) <= 2
    assert calls["lens"].count(calls["lens"][-1]) == 2


@pytest.mark.slow
def test_scheduler_policy_mixed_rows_either_way(runner, tok, con, monkeypatch):
    """A greedy, a seeded and a penalized constrained request side by side: with the joint
    call measured slower the runs drip after the first measurements, measured faster they
    go to one eager call; the tokens are MEMRA_FORCED=0's both ways."""
    from memra.serve.scheduler import GenRequest

    prompts = [tok.encode(p, add_special=False) for p in ("Give JSON:", "An order please", "Paid?")]

    def reqs():
        return [GenRequest(p, SamplingParams(max_tokens=60, **kw), constraint=con)
                for p, kw in zip(prompts, (GREEDY, SEEDED, PENALIZED))]

    off, _ = _serve(runner, tok, reqs(), monkeypatch, "0")
    on, sched = _serve(runner, tok, reqs(), monkeypatch, "1", {"graph": 1e-3, "verify": 20e-3, "eager": 20e-3})
    t = sched.costs.taken
    assert on == off and t["drip"] > 10 and t["verify"] + t["eager"] <= 4, t
    on, sched = _serve(runner, tok, reqs(), monkeypatch, "1", {"graph": 1e-3, "verify": 1e-3, "eager": 1e-3})
    t = sched.costs.taken
    assert on == off and t["drip"] == 0 and t["eager"] > 5, t


# -- memra run: session.generate on the GPU engine ---------------------------------------------------------

@pytest.fixture(scope="module")
def gpu_engine(path):
    from gpu_emulator import FakeGpu

    from memra.gpu.engine import GPUEngine

    return GPUEngine(path, gpu=FakeGpu(1 << 28), n_ctx=160)


@pytest.mark.parametrize("kw", [pytest.param(GREEDY, marks=pytest.mark.slow), SEEDED], ids=["greedy", "seeded"])
def test_run_gpu_forced_runs_are_verification_graphs(gpu_engine, tok, con, kw, monkeypatch):
    """memra run's loop on the emulated GPU engine: each forced run is one verification step
    (forward_run: Runner.verify, its graph replayed); the tokens are the hand-written
    oracle's (the host sampler, one position a step) and MEMRA_FORCED=0's; with the joint
    call measured slower the runs are fed a token a forward, the same tokens."""
    from memra.session import generate

    prompt = tok.encode("Order as JSON:", add_special=True)
    params = SamplingParams(max_tokens=60, **kw)
    want = _plain_host(gpu_engine, tok, prompt, con, params, 160)

    def run(forced):
        monkeypatch.setenv("MEMRA_FORCED", forced)
        evs = list(generate(gpu_engine, tok, prompt, params, n_ctx=160, constraint=con))
        return [e.token for e in evs[:-1]], evs[-1].timings

    calls = _counting(gpu_engine)
    try:
        off, _ = run("0")
        n_off = dict(calls)
        calls.update(step=0, verify=0, lens=[])
        on, t = run("always")
        n_on = dict(calls)
    finally:
        _uncount(gpu_engine)
    assert on == want == off and t.n_forced > len(on) // 2
    assert n_off["verify"] == 0 and n_on["verify"] >= 3
    assert n_on["step"] + n_on["verify"] == n_off["step"] - t.n_forced
    assert any(k[0] == "verify" for k in gpu_engine._graphs)
    # the policy with injected times: a verification step 20x a decode step -> one at a time
    from memra.text import grammar as G

    real = G.FeedCosts.observe
    times = {"graph": 1e-3, "verify": 20e-3}
    monkeypatch.setattr(G.FeedCosts, "observe", lambda self, path, n, s: real(self, path, n, times[path]))
    calls = _counting(gpu_engine)
    try:
        slow, _ = run("1")
    finally:
        _uncount(gpu_engine)
    assert slow == want and calls["verify"] > 0
    # each run length verified twice at most: once dropped (capture), once measured slower
    assert max(calls["lens"].count(n) for n in set(calls["lens"])) <= 2
    assert calls["verify"] < n_on["verify"]
