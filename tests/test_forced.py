"""Fast-forward of a constraint's forced tokens (memra.text.grammar.fast_forward): tokens the
grammar allows alone are emitted without sampling and fed to the model with the sampled token
before them in one step. The contract: the tokens never change.

Oracles, each independent of the code under test:
- the mask itself: llguidance's own numpy bitmask helper says which tokens a position allows;
  a forced token must be the only one;
- plain constrained decoding written out here by hand: one model position at a time, the
  mask filled at every position, the token chosen by the sampling rule over the masked
  logits (memra.sampling.Sampler with its PCG64 stream for the host path; argmax / the
  device sampler's reference_sample at the chosen token's position for the engines' path);
- the same code with MEMRA_FORCED=0 (the path before fast-forward).

Engines: the CPU reference (memra run --device cpu), the GPU runner on the emulated GPU
(tests/gpu_emulator.py: the eager multi-token rows and the decode graph), the CPU engine of
the server, and the server itself through the openai client. The model is a tiny synthetic
llama with SmolLM2's vocabulary (random weights: the constraint makes the output valid)."""

from __future__ import annotations

import asyncio
import json

import jsonschema
import numpy as np
import openai
import pytest

from memra.cpu.reference import ReferenceModel
from memra.gpu.ops.sample import reference_sample
from memra.model.gguf import open_gguf
from memra.sampling import Sampler, SamplingParams
from memra.session import generate
from memra.text.grammar import allowed, compile_constraint, fast_forward, masked, new_masks, single_token
from memra.text.tokenizer import Tokenizer

# long forced runs: fixed keys, a one-value enum, nested objects; a few free choices between
SCHEMA = {"type": "object", "properties": {
    "order": {"type": "object", "properties": {
        "id": {"type": "integer", "minimum": 1, "maximum": 9999},
        "status": {"enum": ["open", "paid", "shipped"]},
        "currency": {"const": "EUR"},
        "items": {"type": "array", "minItems": 1, "maxItems": 2, "items": {
            "type": "object", "properties": {"sku": {"type": "string", "pattern": "^[A-Z]{3}[0-9]{2}$"},
                                             "qty": {"type": "integer", "minimum": 1, "maximum": 9}},
            "required": ["sku", "qty"], "additionalProperties": False}}},
        "required": ["id", "status", "currency", "items"], "additionalProperties": False},
    "paid": {"type": "boolean"}},
    "required": ["order", "paid"], "additionalProperties": False}

GREEDY = dict(temperature=0.0)
SEEDED = dict(temperature=0.9, top_k=20, top_p=0.95, min_p=0.02, seed=11)
PENALIZED = dict(temperature=1.5, top_k=0, top_p=1.0, min_p=0.0, seed=3, repeat_penalty=1.3, presence_penalty=0.2,
                 frequency_penalty=0.1)


@pytest.fixture(scope="module")
def path(tiny_models):
    return tiny_models("llama", "Q4_K_M")


@pytest.fixture(scope="module")
def tok(path):
    return Tokenizer.from_gguf(open_gguf(path))


@pytest.fixture(scope="module")
def con(tok):
    return compile_constraint(tok, "json_schema", SCHEMA)


@pytest.fixture(scope="module")
def ref(path):
    return ReferenceModel(open_gguf(path), numerics="llamacpp")


def _only(words, n_vocab):
    """The token a mask allows when it allows one (llguidance's numpy helper: the oracle of
    the bit order), else None."""
    import llguidance.numpy as lln

    bias = np.zeros(n_vocab, np.float32)
    lln.apply_token_bitmask_inplace(bias, words.reshape(1, -1))
    ok = np.flatnonzero(np.isfinite(bias))
    return int(ok[0]) if ok.size == 1 else None


# -- the grammar side -----------------------------------------------------------------------------

def test_forced_tokens_are_the_only_ones_their_masks_allow(tok, con):
    """A random walk through the schema: at every position where fast_forward takes tokens,
    each is the single token its position's mask allows; where it takes none the mask allows
    several (or the grammar is complete); `limit` caps a run; single_token agrees with
    llguidance's helper on every mask."""
    rng = np.random.default_rng(0)
    m, probe = con.matcher(), con.matcher()
    row, words = new_masks(1, tok.n_vocab)[0], new_masks(1, tok.n_vocab)
    runs, capped = [], 0
    for _ in range(400):
        c = probe.m.deep_copy()
        forced, ready = fast_forward(m, 1 << 30, row)
        for t in forced:
            words[0] = -1
            probe.fill(words[0])
            assert _only(words[0], tok.n_vocab) == t
            assert single_token(words[0], tok.n_vocab) == t
            assert probe.consume(t)
        if ready:  # the mask of the next position: several tokens allowed
            words[0] = -1
            probe.fill(words[0])
            np.testing.assert_array_equal(row, words[0])
            assert _only(row, tok.n_vocab) is None and single_token(row, tok.n_vocab) is None
        elif forced:  # a run ends where the mask allows several tokens, or at the grammar's end
            assert m.stopped
        if len(forced) >= 2:  # the same position with a limit: a prefix of the run, nothing past it
            from memra.text.grammar import Matcher

            again = Matcher(c, tok.n_vocab)
            part, ready2 = fast_forward(again, 1, row)
            assert part == forced[:1] and not ready2
            capped += 1
        runs.append(len(forced))
        if m.stopped:
            m.m.reset()
            probe.m.reset()
            continue
        words[0] = -1
        m.fill(words[0])
        t = int(rng.choice(np.flatnonzero(allowed(words[0], tok.n_vocab))))
        assert m.consume(t) and probe.consume(t)
    assert max(runs) >= 5 and capped > 10  # multi-token runs were exercised
    assert sum(runs) > 400  # most positions of this schema are forced


def test_single_token_reads_only_the_vocabulary():
    row = np.zeros(2, np.int32)
    assert single_token(row, 40) is None
    row[1] = 1 << 3
    assert single_token(row, 40) == 35
    row[1] |= 1 << 9  # a bit past n_vocab = 40 means nothing
    assert single_token(row, 40) == 35
    row[0] = 1
    assert single_token(row, 40) is None
    row[:] = [0, 1 << 9]
    assert single_token(row, 40) is None


def test_sampler_skip_is_the_draws_sample_makes():
    """Sampler.skip(n) leaves the stream where n calls of sample() under single-token masks
    leave it (greedy: no draw)."""
    rng = np.random.default_rng(1)
    for kw in (SEEDED, PENALIZED, GREEDY):
        a, b = (Sampler(SamplingParams(**kw), 50) for _ in range(2))
        hist = [1, 2, 3]
        for t in (7, 9, 7):
            x = np.full(50, -np.inf)
            x[t] = rng.standard_normal()
            assert a.sample(x, hist) == t
            hist.append(t)
        b.skip(3)
        lg = rng.standard_normal((5, 50))
        assert [a.sample(x, hist) for x in lg] == [b.sample(x, hist) for x in lg]


# -- memra run: memra.session.generate --------------------------------------------------------------

def _plain_host(model, tok, prompt, con, params, n_ctx, one_by_one=False):
    """Plain constrained decoding with the host sampler, one position at a time (the oracle);
    the prompt in one forward pass (memra run) or, one_by_one, a position at a time (the
    server's CPU engine)."""
    s = Sampler(params, tok.n_vocab)
    m = con.matcher()
    cache = model.new_cache(n_ctx)
    for t in (prompt if one_by_one else []):
        lg = model.forward([t], cache)
    if not one_by_one:
        lg = model.forward(list(prompt), cache)
    words = new_masks(1, tok.n_vocab)
    hist, out = list(prompt), []
    limit = min(params.max_tokens, n_ctx - len(prompt))
    while len(out) < limit:
        if m.stopped:
            out.append(min(tok.eog_ids))
            break
        m.fill(words[0])
        t = s.sample(masked(lg, words[0]), hist)
        out.append(t)
        hist.append(t)
        if t in tok.eog_ids:
            break
        assert m.consume(t)
        lg = model.forward([t], cache)
    return out


def _generate(model, tok, prompt, con, params, n_ctx, monkeypatch, forced: bool):
    # on: every run fed jointly (MEMRA_FORCED=always), whatever the measured times say
    # (tests/test_forced_graph.py tests the cost policy that may feed them one at a time)
    monkeypatch.setenv("MEMRA_FORCED", "always" if forced else "0")
    evs = list(generate(model, tok, prompt, params, n_ctx=n_ctx, constraint=con))
    return [e.token for e in evs[:-1]], evs[-1]


def _counting(engine):
    """Count the engine's model calls (forward passes, or runner steps and verification
    steps)."""
    calls = []
    for name in (("step", "verify") if hasattr(engine, "step") else ("forward",)):
        orig = getattr(engine, name)

        def counted(*a, _orig=orig, **kw):
            calls.append(1)
            return _orig(*a, **kw)

        setattr(engine, name, counted)
    return calls


@pytest.mark.parametrize("kw", [pytest.param(GREEDY, marks=pytest.mark.slow), SEEDED,
                                pytest.param(PENALIZED, marks=pytest.mark.slow)], ids=["greedy", "seeded", "penalties"])
def test_run_cpu_forced_equals_plain(ref, tok, con, kw, monkeypatch):
    """memra run --device cpu's loop: fast-forward on = off = the hand-written oracle, greedy,
    seeded (PCG64 stream) and with penalties (history-dependent); forced tokens were taken."""
    prompt = tok.encode("Order as JSON:", add_special=True)
    params = SamplingParams(max_tokens=120, **kw)
    want = _plain_host(ref, tok, prompt, con, params, 200)
    on, end = _generate(ref, tok, prompt, con, params, 200, monkeypatch, True)
    off, end0 = _generate(ref, tok, prompt, con, params, 200, monkeypatch, False)
    assert on == want == off
    assert end.finish_reason == end0.finish_reason == "eos"
    assert end.timings.n_forced > len(on) // 2 and end0.timings.n_forced == 0
    jsonschema.validate(json.loads(tok.decode([t for t in on if t not in tok.eog_ids])), SCHEMA)


@pytest.fixture(scope="module")
def gpu_engine(path):
    from gpu_emulator import FakeGpu

    from memra.gpu.engine import GPUEngine

    return GPUEngine(path, gpu=FakeGpu(1 << 28), n_ctx=160)


@pytest.mark.parametrize("kw", [pytest.param(GREEDY, marks=pytest.mark.slow), SEEDED], ids=["greedy", "seeded"])
def test_run_gpu_forced_runs_take_one_step(gpu_engine, tok, con, kw, monkeypatch):
    """memra run --device gpu's loop on the emulated GPU: a forced run is fed with the sampled
    token in one runner call (a verification step, GPUEngine.forward_run); the tokens are
    plain decode's (the oracle: one position a step, hand-written) with far fewer calls."""
    prompt = tok.encode("Order as JSON:", add_special=True)
    params = SamplingParams(max_tokens=120, **kw)
    want = _plain_host(gpu_engine, tok, prompt, con, params, 160)
    calls = _counting(gpu_engine)
    try:
        on, end = _generate(gpu_engine, tok, prompt, con, params, 160, monkeypatch, True)
        n_on = len(calls)
        calls.clear()
        off, _ = _generate(gpu_engine, tok, prompt, con, params, 160, monkeypatch, False)
        n_off = len(calls)
    finally:
        del gpu_engine.step, gpu_engine.verify
    assert on == want == off
    assert n_off == len(off) - 1  # prefill + one step a token (the end token takes none)
    assert n_on == n_off - end.timings.n_forced and n_on < n_off // 2


def test_run_max_tokens_inside_a_forced_run(ref, tok, con, monkeypatch):
    """A token limit that falls inside a forced run: exactly max_tokens tokens, plain
    decode's, finish "length"; the limit is also where fast_forward stopped."""
    prompt = tok.encode("Order as JSON:", add_special=True)
    full = _plain_host(ref, tok, prompt, con, SamplingParams(max_tokens=120, **GREEDY), 200)
    forced = _forced_positions(tok, con, full)
    cut = next(i for i in range(2, len(full)) if i - 1 in forced and i in forced and i + 1 in forced)
    for n in (cut, cut + 1):
        params = SamplingParams(max_tokens=n, **GREEDY)
        on, end = _generate(ref, tok, prompt, con, params, 200, monkeypatch, True)
        assert on == full[:n] and end.finish_reason == "length"
        assert end.timings.n_forced == sum(1 for i in range(n) if i in forced)


def _forced_positions(tok, con, tokens):
    """Indices of `tokens` whose position's mask allows that token alone and that follow a
    sampled token or another forced one (fast_forward takes runs after a sampled token)."""
    m = con.matcher()
    w = new_masks(1, tok.n_vocab)
    out = set()
    for i, t in enumerate(tokens):
        if m.stopped:
            break
        m.fill(w[0])
        if i > 0 and _only(w[0], tok.n_vocab) == t:
            out.add(i)
        assert m.consume(t)
    return out


# -- the server's scheduler ----------------------------------------------------------------------

def run_requests(sched, reqs):
    """GenRequests through a Scheduler (started here, stopped after): each request's (token
    ids, its "done" event); an "error" event fails the test."""
    async def go():
        for q in reqs:
            sched.submit(q)

        async def one(q):
            out, done = [], None
            async for ev in q.events():
                if ev[0] == "token":
                    out.append(ev[1])
                elif ev[0] == "done":
                    done = ev
                elif ev[0] == "error":
                    raise AssertionError(ev)
            return out, done

        return await asyncio.gather(*(one(q) for q in reqs))

    sched.start()
    try:
        return asyncio.run(go())
    finally:
        sched.stop()


def _serve(engine, tok, reqs, monkeypatch, forced: bool, budget: int = 64):
    """Run GenRequests through a Scheduler; (token lists, steps, forced tokens, events in
    order per request)."""
    from memra.serve.scheduler import Scheduler

    monkeypatch.setenv("MEMRA_FORCED", "always" if forced else "0")
    sched = Scheduler(engine, tok, max_queue=8, max_batched_tokens=budget)
    assert sched.fast_forward is forced

    res = []
    for out, done in run_requests(sched, reqs):
        assert done is not None and done[2]["completion_tokens"] == len(out)
        res.append((out, done[1]))
    return res, sched.steps, sched.forced_tokens


def _requests(tok, con, max_tokens=100):
    from memra.serve.scheduler import GenRequest

    prompts = [tok.encode(p, add_special=False) for p in ("Give JSON:", "An order please", "free text", "Paid?")]
    return [GenRequest(prompts[0], SamplingParams(max_tokens=max_tokens, **GREEDY), constraint=con),
            GenRequest(prompts[1], SamplingParams(max_tokens=max_tokens, **SEEDED), constraint=con),
            GenRequest(prompts[2], SamplingParams(max_tokens=12, **GREEDY), ignore_eos=True),
            GenRequest(prompts[3], SamplingParams(max_tokens=max_tokens, **PENALIZED), constraint=con)]


def _device_oracle(ref, tok, con, prompt, kw, max_tokens):
    """Plain constrained decoding by the engines' rule (argmax, or the device sampler's draw
    at the chosen token's position), one position at a time as the CPU engine computes."""
    m = con.matcher()
    cache = ref.new_cache(len(prompt) + max_tokens + 1)
    for t in prompt:
        lg = ref.forward([t], cache)
    w = new_masks(1, tok.n_vocab)
    out = []
    while len(out) < max_tokens:
        if m.stopped:
            out.append(min(tok.eog_ids))
            break
        m.fill(w[0])
        x = masked(lg, w[0])
        pos = len(prompt) + len(out)
        t = int(np.argmax(x)) if not kw["temperature"] else \
            reference_sample(x, kw["temperature"], kw["top_k"], kw["top_p"], kw["min_p"], kw["seed"], pos)
        out.append(t)
        if t in tok.eog_ids:
            break
        assert m.consume(t)
        lg = ref.forward([t], cache)
    return out


@pytest.mark.slow
def test_scheduler_cpu_engine_forced_equals_plain(path, ref, tok, con, monkeypatch):
    """Continuous batching on the CPU engine: constrained greedy, seeded (device rule) and
    penalized (host sampler) requests beside a free one; fast-forward on = off, the greedy
    and seeded ones = the hand-written oracle; fewer steps; the forced tokens counted."""
    from memra.serve.cpu_engine import CpuRunner

    eng = CpuRunner(open_gguf(path), max_len=160, max_seqs=4)
    on, steps_on, n_forced = _serve(eng, tok, _requests(tok, con), monkeypatch, True)
    off, steps_off, n0 = _serve(eng, tok, _requests(tok, con), monkeypatch, False)
    assert on == off and n0 == 0 and n_forced > 0
    assert steps_on < steps_off * 2 // 3
    for i, kw in ((0, GREEDY), (1, SEEDED)):
        prompt = _requests(tok, con)[i].prompt
        assert on[i][0] == _device_oracle(ref, tok, con, prompt, kw, 100), i
    for i in (0, 1, 3):
        assert on[i][1] == "stop"
        jsonschema.validate(json.loads(tok.decode([t for t in on[i][0] if t not in tok.eog_ids])), SCHEMA)


@pytest.mark.slow
def test_scheduler_emulated_gpu_forced_equals_plain(path, tok, con, monkeypatch):
    """The same on the GPU runner (emulated): forced rows go with the prompt chunks as
    multi-token eager rows, the others stay on the decode graph; a small token budget (a
    forced run is capped by it) and a token limit inside forced runs."""
    from gpu_emulator import FakeGpu

    from memra.gpu.runner import Runner

    r = Runner(path, gpu=FakeGpu(1 << 28), max_len=160, max_seqs=4)
    for budget, max_tokens in ((64, 100), (4, 23)):
        on, steps_on, n_forced = _serve(r, tok, _requests(tok, con, max_tokens), monkeypatch, True, budget)
        off, steps_off, _ = _serve(r, tok, _requests(tok, con, max_tokens), monkeypatch, False, budget)
        assert on == off and n_forced > 0 and steps_on < steps_off, budget
        if max_tokens == 23:
            assert all(len(t) == 23 and f == "length" for t, f in (on[0], on[1], on[3]))


def test_scheduler_max_tokens_inside_a_forced_run(path, ref, tok, con, monkeypatch):
    """The server's token limit falling inside forced runs (every limit from 1 to 30 for the
    greedy request): exactly max_tokens tokens, the oracle's, finish length."""
    from memra.serve.cpu_engine import CpuRunner
    from memra.serve.scheduler import GenRequest

    eng = CpuRunner(open_gguf(path), max_len=160, max_seqs=4)
    prompt = tok.encode("Give JSON:", add_special=False)
    full = _device_oracle(ref, tok, con, prompt, GREEDY, 100)
    forced = _forced_positions(tok, con, full)
    cuts = [i for i in range(2, 30) if i - 1 in forced and i in forced][:3]
    assert cuts
    reqs = [GenRequest(prompt, SamplingParams(max_tokens=n, **GREEDY), constraint=con) for n in cuts]
    res, _, n_forced = _serve(eng, tok, reqs, monkeypatch, True)
    for n, (toks, finish) in zip(cuts, res):
        assert toks == full[:n] and finish == "length", n
    assert n_forced == sum(sum(1 for i in range(n) if i in forced) for n in cuts)


# -- the server through the openai client ------------------------------------------------------------

@pytest.fixture(scope="module")
def server(path):
    from memra.serve.api import ServeConfig, Server

    s = Server(ServeConfig(model=str(path), alias="tiny", device="cpu", port=0, ctx_size=256, parallel=2))
    s.start_in_thread()
    yield s
    s.stop()


def _forced_total(server) -> float:
    """memra:forced_tokens_total from the server's /metrics."""
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(server.url + "/metrics", trust_env=False).text
    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples
               if s.name == "memra:forced_tokens_total")


def test_server_json_schema_forced_tokens_stream_in_order(server, ref, tok, con):
    """A json_schema completion, blocking and streamed: the oracle's tokens (the text of
    every token, forced ones included, in order) and memra:forced_tokens_total counts them."""
    c = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=300)
    prompt = "Order as JSON:"
    ids = tok.encode(prompt, add_special=True, parse_special=True)
    want = _device_oracle(ref, tok, con, ids, SEEDED, 120)
    want_text = tok.decode([t for t in want if t not in tok.eog_ids], skip_special=True)
    kw = dict(model="tiny", prompt=prompt, max_tokens=120, temperature=SEEDED["temperature"],
              top_p=SEEDED["top_p"], seed=SEEDED["seed"],
              extra_body={"json_schema": SCHEMA, "top_k": SEEDED["top_k"], "min_p": SEEDED["min_p"]})
    f0 = _forced_total(server)
    r = c.completions.create(**kw)
    assert r.choices[0].text == want_text
    assert r.usage.completion_tokens == len(want)
    f1 = _forced_total(server)
    assert f1 - f0 >= len(want) // 2
    pieces = [ch.choices[0].text for ch in c.completions.create(stream=True, **kw) if ch.choices]
    assert "".join(pieces) == want_text
    assert len([p for p in pieces if p]) >= len(want) // 2  # token by token, not one late lump
    assert _forced_total(server) - f1 == f1 - f0
    jsonschema.validate(json.loads(want_text), SCHEMA)


def test_server_penalized_request_forced_equals_plain(server, ref, tok, con):
    """Penalties: the server's host sampler (PCG64 stream, the history) under fast-forward
    gives the hand-written oracle's tokens; a limit cuts the document inside a forced run."""
    c = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=300)
    prompt = "Order as JSON:"
    ids = tok.encode(prompt, add_special=True, parse_special=True)
    params = SamplingParams(max_tokens=30, **PENALIZED)
    want = _plain_host(ref, tok, ids, con, params, 256, one_by_one=True)
    f2 = _forced_total(server)
    r = c.completions.create(model="tiny", prompt=prompt, max_tokens=30, temperature=params.temperature,
                             seed=params.seed, presence_penalty=params.presence_penalty,
                             frequency_penalty=params.frequency_penalty,
                             extra_body={"json_schema": SCHEMA, "repetition_penalty": params.repeat_penalty,
                                         "top_k": params.top_k, "top_p": params.top_p, "min_p": params.min_p})
    assert r.choices[0].text == tok.decode([t for t in want if t not in tok.eog_ids], skip_special=True)
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 30
    assert {28, 29} <= _forced_positions(tok, con, want)  # the limit fell inside a forced run
    assert _forced_total(server) - f2 >= 10


# -- experiments/structured_speed.py's json-ff arm ----------------------------------------------------

def test_structured_speed_json_ff_arm_emits_json_arms_tokens(path, tok):
    """The H200 measurement's json-ff arm on the emulated runner: the same tokens as arm json
    (row 0, every emitted token, the forced ones included) whichever way the runs are fed —
    jointly (batch 2: one eager call; batch 1: verification steps; about a quarter of the
    sampled steps a token on the nested schema) or dripped a token a decode step — every
    row at steps + 1 tokens."""
    import sys
    from pathlib import Path

    from gpu_emulator import FakeGpu

    from memra.gpu.runner import Runner
    from memra.text.grammar import FeedCosts

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "experiments"))
    import structured_speed as SS

    con = compile_constraint(tok, "json_schema", SS.NESTED)
    r = Runner(path, gpu=FakeGpu(1 << 28), max_len=64, max_seqs=2)
    prompt = tok.encode("Reply with the order as JSON:", add_special=True)
    js = SS.run_arm(r, tok, con, 2, 12, "json", prompt)
    ff = SS.run_arm(r, tok, con, 2, 12, "json-ff", prompt, FeedCosts(fixed="joint"))
    assert ff["row0"] == js["row0"] and len(js["row0"]) == 13
    assert ff["forced"] + ff["row_steps"] == 2 * 12
    assert ff["steps_per_token"] < 0.5 and ff["calls"] < 12 // 2 and ff["eager_calls"] > 0
    dr = SS.run_arm(r, tok, con, 2, 12, "json-ff", prompt, FeedCosts(fixed="drip"))
    assert dr["row0"] == js["row0"] and dr["forced"] == ff["forced"] and dr["drip_rows"] > 0
    assert dr["eager_calls"] == dr["verify_calls"] == 0
    one = SS.run_arm(r, tok, con, 1, 12, "json-ff", prompt, FeedCosts(fixed="joint"))
    assert one["row0"] == js["row0"] and one["verify_calls"] > 0 and one["eager_calls"] == 0
